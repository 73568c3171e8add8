"""Each choice list is written once, and the configuration's modules import one way only.

A field typed ``Literal[...]`` states its choices in its annotation: the parser, validation and the profile
schema read them from there (``FIELD_CHOICES``), in the same order. The field declarations sit below
resolution and validation, and the rank layout and peer sync below what uses them, so none of these
modules names, even in an annotation, a module that imports it.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from tests.import_graph import import_graph
from tokenspeed.config.cli import build_parser
from tokenspeed.config.flags import FIELD_CHOICES
from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.server_fields import ServerFields, type_alternatives


def _literal_fields() -> dict[str, tuple]:
    hints = typing.get_type_hints(ServerFields)
    return {
        f.name: typing.get_args(kind)
        for f in dataclasses.fields(ServerFields)
        for kind in type_alternatives(hints[f.name])
        if typing.get_origin(kind) is typing.Literal
    }


def test_literal_fields_exist():
    assert {"ep_dispatch_algorithm", "expert_distribution_recorder_mode", "deepep_mode"} <= set(_literal_fields())


@pytest.mark.parametrize("name", sorted(_literal_fields()))
def test_literal_choices_are_the_flag_choices_in_order(name):
    declared = _literal_fields()[name]
    assert FIELD_CHOICES[name] == declared
    action = next(a for a in build_parser()._actions if a.dest == name)
    assert tuple(action.choices) == declared


def test_a_choice_outside_the_literal_is_refused():
    with pytest.raises(ValueError, match="--deepep-mode 'fast' is not supported; choose one of normal"):
        ServerArgs(model="m", device="cpu", deepep_mode="fast")


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("tokenspeed/config/server_fields.py", {"tokenspeed.config.server_args", "tokenspeed.config.resolve"}),
        ("tokenspeed/config/resolve.py", {"tokenspeed.config.server_args"}),
        ("tokenspeed/config/validate.py", {"tokenspeed.config.server_args"}),
        ("tokenspeed/config/flags.py", {"tokenspeed.config.server_args", "tokenspeed.config.validate"}),
        ("tokenspeed/runtime/distributed/mapping.py", {"tokenspeed.config.server_args", "tokenspeed.config.server_fields"}),
        ("tokenspeed/runtime/distributed/peer_sync.py", {"tokenspeed.runtime.execution.model_runner"}),
    ],
)
def test_lower_modules_do_not_import_upward(module, forbidden):
    name = module.removesuffix(".py").replace("/", ".")
    assert not import_graph()[name] & forbidden
