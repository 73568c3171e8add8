"""The ``tokenspeed serve`` command line: the parser built from the flag table (``config.flag_table``)
and the namespace -> ``ServerArgs`` mapping."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
from typing import Any

from tokenspeed.config.api_key import resolve_api_key
from tokenspeed.config.flag_rows import add_groups
from tokenspeed.config.flag_table import GROUPS
from tokenspeed.config.flags import FIELD_ALIASES
from tokenspeed.config.server_args import ServerArgs

# Namespace attributes that are spellings of a field rather than fields themselves.
CLI_ALIAS_DESTS = {
    **{dest: FIELD_ALIASES[dest] for dest in ("model_path", "tensor_parallel_size", "expert_parallel_size")},
    "api_key_file": "api_key",  # read by namespace_to_fields (config/api_key.py)
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    # Prefix matching would make adding a flag a breaking change for scripts using an abbreviation.
    parser.allow_abbrev = False
    add_groups(parser, GROUPS)


def namespace_to_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Turn a parsed namespace into ``ServerArgs`` keyword arguments, folding flag aliases."""
    values = dict(vars(args))
    positional = values.pop("model_path", None)
    if positional is not None and values.get("model") is not None:
        raise ValueError("the model is given twice (positional and --model); keep one of them")
    if positional is not None:
        values["model"] = positional
    if values.get("model") is None:
        raise ValueError("a model is required: `tokenspeed serve MODEL` or --model MODEL")
    tp = values.pop("tensor_parallel_size", None)
    if tp is not None:
        if values.get("attn_tp_size") is not None:
            raise ValueError(
                "--tp/--tensor-parallel-size and --attn-tp-size set the same size; pass only one"
            )
        values["attn_tp_size"] = tp
    ep = values.pop("expert_parallel_size", None)
    values["ep_size"] = 1 if ep is None else ep
    if "api_key" in values:
        values["api_key"] = resolve_api_key(values["api_key"], values.pop("api_key_file", None), os.environ)
    if "metrics_reporters" in values:
        # Repeated flags can name a reporter twice; keep the first of each.
        values["metrics_reporters"] = list(dict.fromkeys(values["metrics_reporters"] or ["prometheus"]))
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    # Only pass what the parser produced, so fields without a flag keep their dataclass default.
    return {name: value for name, value in values.items() if name in names}


def from_namespace(args: argparse.Namespace, platform: Any = None) -> ServerArgs:
    """Build (and resolve) a ``ServerArgs`` from a namespace parsed by ``build_parser()``."""
    return ServerArgs(**namespace_to_fields(args), platform=platform)


class _ServeArgumentParser(argparse.ArgumentParser):
    """argparse, plus a "did you mean" for a mistyped flag (there are more than 150 of them)."""

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            known = [opt for action in self._actions for opt in action.option_strings]
            hints = []
            for word in message.split(":", 1)[1].split():
                if word.startswith("--"):
                    flag = word.split("=", 1)[0]
                    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
                    if close:
                        hints.append(f"{flag}: did you mean {close[0]}?")
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """A parser with every ``tokenspeed serve`` flag."""
    parser = _ServeArgumentParser(prog=prog, allow_abbrev=False)
    add_cli_args(parser)
    return parser


def prepare_server_args(argv: list[str], platform: Any = None) -> ServerArgs:
    """Parse ``argv`` (typically ``sys.argv[2:]`` after ``serve``) into a resolved ``ServerArgs``."""
    return from_namespace(build_parser().parse_args(argv), platform=platform)
