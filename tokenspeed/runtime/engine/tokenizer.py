"""Loading the tokenizer of a served model, and the chat template used when a model folder has none.

The main process (AsyncLLM) and the offline Engine tokenize and detokenize; scheduler processes never do.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tokenspeed.config.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Used only when the tokenizer files carry no chat template (tiny test models, base models), so that
# /v1/chat/completions still answers: a ChatML-shaped prompt, the most common convention.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SUPPORTED_MODES = ("auto", "slow")


def get_tokenizer(server_args: ServerArgs):
    """The Hugging Face tokenizer for `server_args`, or None with `--skip-tokenizer-init`.

    Reads `--tokenizer` (defaults to the model folder), `--tokenizer-mode` (`auto` = fast tokenizer,
    `slow` = the Python one), `--trust-remote-code` and `--revision`.
    """
    if server_args.skip_tokenizer_init:
        return None
    path = server_args.tokenizer or server_args.model
    if not path:
        raise ValueError("no tokenizer to load: pass a model folder (or --tokenizer PATH)")
    mode = server_args.tokenizer_mode
    if mode not in _SUPPORTED_MODES:
        raise ValueError(
            f"--tokenizer-mode {mode} is not available in this build; use one of {list(_SUPPORTED_MODES)}"
        )
    from tokenspeed.demo_models import resolve_model_path

    return load_tokenizer(
        resolve_model_path(str(path)),
        use_fast=mode != "slow",
        trust_remote_code=server_args.trust_remote_code,
        revision=server_args.revision,
    )


def load_tokenizer(path: str, *, use_fast: bool = True, trust_remote_code: bool = False, revision=None):
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"use_fast": use_fast, "trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    if os.path.isdir(path):
        # A local folder never needs the hub; saying so avoids network look-ups on offline machines.
        kwargs["local_files_only"] = True
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except Exception as exc:  # a damaged tokenizer.json fails deep in transformers (KeyError, TypeError, ...)
        raise ValueError(
            f"cannot load a tokenizer from {path!r}: {type(exc).__name__}: {exc}. Pass a local folder holding tokenizer files "
            "(--tokenizer PATH), or --skip-tokenizer-init to send token ids instead of text"
        ) from exc
    if use_fast and not getattr(tokenizer, "is_fast", False):
        logger.warning("no fast tokenizer for %s; using the slow one (expect lower throughput)", path)
    return tokenizer


def apply_chat_template(
    tokenizer,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of `messages` rendered through the tokenizer's chat template (or the fallback)."""
    template = getattr(tokenizer, "chat_template", None) or FALLBACK_CHAT_TEMPLATE
    text = tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        **template_kwargs,
    )
    # The template already wrote any BOS it wants; a second one from encode() would shift the prompt.
    return tokenizer.encode(text, add_special_tokens=False)


def eos_token_ids(tokenizer, model_config: Any = None) -> list[int]:
    """Every id that ends generation: the tokenizer's EOS plus the model config's (which may be a list)."""
    ids: list[int] = []
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    cfg_eos = getattr(model_config, "eos_token_id", None) if model_config is not None else None
    if isinstance(cfg_eos, int):
        cfg_eos = [cfg_eos]
    for i in cfg_eos or []:
        if int(i) not in ids:
            ids.append(int(i))
    return ids
