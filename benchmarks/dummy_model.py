"""A model folder to serve with `--load-format dummy`: a config.json and a tokenizer covering the whole
vocabulary, so nothing is downloaded and every generated token shows up as text.

The tokenizer is word-level: id i is the word `w<i>`, words are separated by spaces. A real checkpoint's
tokenizer would do too, but a stand-in tokenizer whose vocabulary is smaller than the model's (the tiny
test tokenizers, say) decodes most random ids to nothing, and a stream then shows text only every few
dozen tokens: time between text chunks (ITL) stops measuring time between tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_model_folder(config: dict[str, Any], path: str | Path) -> str:
    """Write `config` (a Hugging Face config dict) and a matching word-level tokenizer into `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    vocab_size = int(config["vocab_size"])
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    special = {}
    for key in ("bos_token_id", "eos_token_id"):
        tid = config.get(key)
        if isinstance(tid, int) and 0 <= tid < vocab_size:
            special[key.replace("_id", "")] = f"w{tid}"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", **special)
    fast.save_pretrained(str(path))
    return str(path)


def prompt_text(token_ids: list[int]) -> str:
    """The text that tokenizes back to exactly `token_ids` with this tokenizer."""
    return " ".join(f"w{i}" for i in token_ids)
