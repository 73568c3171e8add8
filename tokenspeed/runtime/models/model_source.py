"""Where a server's model and tokenizer files come from, checked before anything slow starts.

TokenSpeed serves a local Hugging Face folder (or a packaged demo model name) and never downloads weights.
A name that is neither used to fail only after transformers retried the hub for most of a minute on a
machine without network; `check_model_source` answers in well under a second instead. A tokenizer given
as a hub name still loads through transformers, but only when the hub can be reached (and not offline).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from urllib.parse import urlparse

from tokenspeed.demo_models import demo_model_names, resolve_model_path

# How long the hub gets to accept a TCP connection before it counts as unreachable.
HUB_PROBE_S = 0.7
_TRUE = {"1", "on", "yes", "true"}


def hub_offline() -> bool:
    return any(
        os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_reachable(timeout: float = HUB_PROBE_S) -> bool:
    """One TCP connect to the hub endpoint; DNS runs in a thread so a resolver timeout cannot stall us."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = (
        endpoint.hostname or "huggingface.co",
        endpoint.port or (80 if endpoint.scheme == "http" else 443),
    )
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.1)
    return bool(result and result[0])


def _local(name: str) -> str:
    return os.path.expanduser(resolve_model_path(name))


def _hub_state() -> str | None:
    """Why the hub cannot help, or None when it can be reached."""
    if hub_offline():
        return "the hub is switched off here (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)"
    if not hub_reachable():
        return "the Hugging Face hub is not reachable from this machine"
    return None


def check_model_source(model: str, tokenizer: str | None, skip_tokenizer: bool = False) -> None:
    """ValueError naming the flag when the model (or the tokenizer) cannot be found without waiting."""
    if not os.path.isdir(_local(model)):
        hub = _hub_state() or "TokenSpeed does not download models from the hub"
        raise ValueError(
            f"--model {model!r} is neither a local folder nor a demo model name "
            f"({', '.join(demo_model_names())}), and {hub}; download the model elsewhere and pass its folder "
            "with --model"
        )
    if skip_tokenizer or not tokenizer or os.path.isdir(_local(tokenizer)):
        return
    hub = _hub_state()
    if hub is not None:
        raise ValueError(
            f"--tokenizer {tokenizer!r} is neither a local folder nor reachable: {hub}; pass a local folder "
            "holding the tokenizer files"
        )


def check_weights_readable(model: str, load_format: str) -> None:
    """ValueError naming the file when a safetensors file of the model cannot be read (a truncated copy, an
    interrupted download): found from the headers in the server's first second, not once every rank has
    started and read it, tens of seconds later and again at each of a supervisor's restarts."""
    if load_format not in ("auto", "safetensors"):
        return
    folder = _local(model)
    index = os.path.join(folder, "model.safetensors.index.json")
    try:
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError):
        names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    from safetensors import SafetensorError, safe_open

    for name in names:
        path = os.path.join(folder, name)
        try:
            with safe_open(path, framework="numpy"):  # the header only; no framework import
                pass
        except (SafetensorError, OSError) as exc:
            raise ValueError(
                f"weights file {path} cannot be read ({type(exc).__name__}: {exc}): the checkpoint is damaged "
                "or incomplete; copy or download it again"
            ) from exc
