"""get_tokenizer: loading from a model folder, the flags that steer it, chat templates."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.server.tokenizer_fixtures import byte_level_tokenizer
from tests.tiny_models import CHAT_TEMPLATE, save_tiny_tokenizer
from tokenspeed.runtime.engine.tokenizer import FALLBACK_CHAT_TEMPLATE, apply_chat_template, get_tokenizer


def _args(**kw):
    base = dict(
        model=None,
        tokenizer=None,
        tokenizer_mode="auto",
        skip_tokenizer_init=False,
        trust_remote_code=False,
        revision=None,
    )
    return SimpleNamespace(**{**base, **kw})


def test_loads_fast_tokenizer_from_model_folder(tmp_path):
    save_tiny_tokenizer(tmp_path)
    tok = get_tokenizer(_args(model=str(tmp_path)))
    assert tok.is_fast
    assert tok.decode(tok.encode("Hello, world!", add_special_tokens=False)) == "Hello, world!"


def test_tokenizer_flag_overrides_model_folder(tmp_path):
    tok_dir = tmp_path / "tok"
    save_tiny_tokenizer(tok_dir)
    tok = get_tokenizer(_args(model=str(tmp_path / "no-such-model"), tokenizer=str(tok_dir)))
    assert tok.eos_token == "<|end_of_text|>"


def test_slow_mode_and_skip_init(tmp_path):
    save_tiny_tokenizer(tmp_path)
    assert get_tokenizer(_args(model=str(tmp_path), skip_tokenizer_init=True)) is None
    with pytest.raises(ValueError, match="--tokenizer-mode deepseek_v4"):
        get_tokenizer(_args(model=str(tmp_path), tokenizer_mode="deepseek_v4"))


def test_missing_tokenizer_names_the_fix(tmp_path):
    with pytest.raises(ValueError, match="--skip-tokenizer-init"):
        get_tokenizer(_args(model=str(tmp_path)))


def test_chat_template_from_folder_and_fallback(tmp_path):
    save_tiny_tokenizer(tmp_path)
    tok = get_tokenizer(_args(model=str(tmp_path)))
    assert tok.chat_template == CHAT_TEMPLATE
    ids = apply_chat_template(tok, [{"role": "user", "content": "Hi"}])
    assert tok.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"

    bare = byte_level_tokenizer()
    assert not bare.chat_template
    ids = apply_chat_template(bare, [{"role": "user", "content": "Hi"}])
    assert bare.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert "im_start" in FALLBACK_CHAT_TEMPLATE
