"""Small tokenizers built offline for the detokenizer and HTTP tests.

Two families matter for incremental detokenization: byte-level BPE (GPT-2, Llama 3, Qwen: multi-byte
characters split across tokens) and SentencePiece-style BPE with byte fallback (Llama 2, Mistral: "▁" for
spaces, a leading space dropped at the start of a decode).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! This is a tiny tokenizer for tests, with numbers 0123456789.",
    "Stop strings may form across token boundaries; the server must hold them back.",
    "Streaming text arrives one token at a time, and users expect clean deltas.",
    "café naïve résumé — über straße, 東京 and 🎉 emoji",
] * 4


def byte_level_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>"
    )


def sentencepiece_like_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """Llama-2-style: Metaspace pieces, byte fallback for characters outside the vocabulary."""
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    ascii_corpus = [line.encode("ascii", "ignore").decode() for line in CORPUS]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    base.train_from_iterator(ascii_corpus, trainer)
    with tempfile.TemporaryDirectory() as tmp:
        base.model.save(tmp)
        vocab = json.loads((Path(tmp) / "vocab.json").read_text())
        merges_lines = (Path(tmp) / "merges.txt").read_text().splitlines()
    merges = [tuple(line.split(" ")) for line in merges_lines if line and not line.startswith("#version")]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = base.normalizer
    tok.pre_tokenizer = base.pre_tokenizer
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>"
    )
