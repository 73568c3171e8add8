"""Applies the support table (``config.support``) to a resolved ``ServerArgs``.

Which fields did the user set? Resolution derives values (``enable_allreduce_fusion`` on Hopper TP, the
CPU's ``disable_prefill_graph``, the drafter's attention backend), so a resolved value that differs from
the dataclass default is not necessarily a user's choice. For each such field the check resolves the
arguments again with that field alone put back to its default: a derived value comes back, a user's
choice does not.

Only resolution runs here (no torch, no model files), so ``tokenspeed serve`` refuses a bad value in
well under two seconds, before any process starts or weight is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tokenspeed.config.support import IMPLEMENTED, NO_EFFECT, REFUSED, SPECULATIVE_IN_CHECKPOINT, SUPPORT

if TYPE_CHECKING:
    from tokenspeed.config.server_args import ServerArgs

@dataclasses.dataclass(frozen=True)
class SupportReport:
    # field -> (the setting as the user spells it, the reason, what to do instead), for every refused one
    refused: dict[str, tuple[str, str, str]]
    # field -> flag, for the "accepted, no effect by design" fields that were set
    no_effect: dict[str, str]

    def error(self) -> str:
        """One sentence per reason, naming every setting refused for it (a feature has several flags)."""
        grouped: dict[tuple[str, str], list[str]] = {}
        for setting, reason, instead in self.refused.values():
            grouped.setdefault((reason, instead), []).append(setting)
        return "; ".join(
            f"{', '.join(settings)}: {reason} ({instead})" for (reason, instead), settings in grouped.items()
        )


def flag_of(name: str) -> str:
    """How a user spells the field: its long flag, or the profile key when it has none."""
    from tokenspeed.config.cli import rows_by_field
    from tokenspeed.config.flag_rows import spelling

    row = rows_by_field().get(name)
    return f"{name} (a profile / Engine key)" if row is None else spelling(row.flags, name)


def _defaults() -> dict[str, Any]:
    from tokenspeed.config.flag_rows import field_defaults

    return field_defaults()


@contextlib.contextmanager
def _quiet_resolution() -> Iterator[None]:
    # The baseline repeats the resolution the server already logged; its info lines would be duplicates.
    resolve_logger = logging.getLogger("tokenspeed.config.resolve")
    level = resolve_logger.level
    resolve_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        resolve_logger.setLevel(level)


def set_fields(args: ServerArgs) -> dict[str, Any]:
    """The not-implemented fields the user set: those whose value resolution does not give back when the
    field alone is put back to its default (a value derived from other settings comes back)."""
    defaults = _defaults()
    values = vars(args)  # fields read by name, as the support table lists them
    out: dict[str, Any] = {}
    with _quiet_resolution():
        for name, support in SUPPORT.items():
            if support.status == IMPLEMENTED or name not in defaults:
                continue
            value = values[name]
            if value == defaults[name]:
                continue
            try:
                derived = vars(dataclasses.replace(args, **{name: defaults[name]}))[name]
            except ValueError:
                derived = None  # other settings need this one as given: it was not derived from them
            if derived != value:
                out[name] = value
        # Two fields that derive each other (a draft path equal to the model, --draft-model-path-use-base)
        # both come back alone: put every remaining one back at once and see which still differ.
        rest = {
            n: defaults[n]
            for n, s in SUPPORT.items()
            if s.status != IMPLEMENTED and n in defaults and n not in out and values[n] != defaults[n]
        }
        if rest:
            try:
                joint = vars(dataclasses.replace(args, **rest))
                out.update({n: values[n] for n in rest if joint[n] != values[n]})
            except ValueError:
                out.update({n: values[n] for n in rest})
    return out


def _setting(name: str, value: Any) -> str:
    """The setting as typed: ``--flag value``, or the bare flag of a switch that was turned on."""
    if value is True:
        return flag_of(name)
    return f"{flag_of(name)} {' '.join(map(str, value)) if isinstance(value, list) else value}"


def assess(args: ServerArgs) -> SupportReport:
    refused: dict[str, tuple[str, str, str]] = {}
    no_effect: dict[str, str] = {}
    values = vars(args)
    for name, value in set_fields(args).items():
        support = SUPPORT[name]
        if support.status == REFUSED:
            refused[name] = (_setting(name, value), support.note, support.instead)
        elif support.status == NO_EFFECT:
            no_effect[name] = flag_of(name)
    for name, support in SUPPORT.items():
        if support.status != IMPLEMENTED or support.values is None:
            continue
        value = values[name]
        bad = [item for item in (value if isinstance(value, list) else [value]) if item not in support.values]
        if bad:
            choices = ", ".join(str(v) for v in support.values if v is not None)
            refused[name] = (
                _setting(name, bad),
                "not implemented in this build",
                f"use one of {choices}",
            )
    if values["draft_model_path_use_base"]:
        # derived from a draft path equal to the model as well, so set_fields may not list it
        support = SUPPORT["draft_model_path_use_base"]
        refused["draft_model_path_use_base"] = (flag_of("draft_model_path_use_base"), support.note, support.instead)
    draft = values["speculative_draft_model_path"]
    if values["speculative_algorithm"] == "EAGLE3" and not os.path.isfile(os.path.join(str(draft), "config.json")):
        # found before the target's weights are read, rather than after
        refused["speculative_draft_model_path"] = (
            f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {draft}",
            "that folder holds no config.json",
            "pass the folder of an EAGLE3 draft in the Hugging Face layout (config.json, *.safetensors)",
        )
    if values["speculative_algorithm"] in SPECULATIVE_IN_CHECKPOINT:
        algo = values["speculative_algorithm"]
        how = (
            "MTP drafts with the multi-token-prediction layers of the target checkpoint"
            if algo == "MTP"
            else "DFLASH drafts a block at once with a block-diffusion draft this build has no loader for"
        )
        refused["speculative_algorithm"] = (
            f"--speculative-algorithm {algo}",
            f"{how}, and none of the supported architectures (Llama, Qwen2, Qwen3, Qwen3-MoE) carries MTP layers",
            "use --speculative-algorithm EAGLE3 with --speculative-draft-model-path, or NGRAM",
        )
    backend = values["grammar_backend"]
    if backend in ("xgrammar", "llguidance") and importlib.util.find_spec(backend) is None:
        # xgrammar is a dependency of the package and llguidance of its llguidance extra, but a hand-made
        # environment may lack them: say so before loading weights
        refused["grammar_backend"] = (
            f"--grammar-backend {backend}",
            f"the {backend} package is not installed",
            f"pip install {backend}",
        )
    return SupportReport(refused, no_effect)


def refuse_unsupported(args: ServerArgs) -> SupportReport:
    """Raise ``ValueError`` naming every refused setting; return the report (for its no-effect flags)."""
    report = assess(args)
    if report.refused:
        raise ValueError(report.error())
    return report


def no_effect_warning(report: SupportReport) -> str | None:
    """The one WARNING line a server logs for the no-effect flags it was given, or None."""
    if not report.no_effect:
        return None
    return (
        "accepted with no effect in this build (support table: tokenspeed/config/support.py): "
        + ", ".join(report.no_effect.values())
    )


def field_statuses(args: ServerArgs, report: SupportReport | None = None) -> dict[str, str]:
    """``--print-config``: the support status of every field whose value differs from its default."""
    defaults = _defaults()
    report = report or assess(args)
    values = vars(args)
    out: dict[str, str] = {}
    for name, support in SUPPORT.items():
        if name in report.refused:
            setting, reason, instead = report.refused[name]
            out[name] = f"{REFUSED}: {reason} ({instead})"
        elif name in defaults and values[name] == defaults[name]:
            continue
        elif support.status == IMPLEMENTED or name in report.no_effect:
            out[name] = support.status
        elif name in defaults:
            # Derived by resolution from other settings, not set by the user: nothing runs from it.
            out[name] = f"derived, unused ({support.status})"
    return out
