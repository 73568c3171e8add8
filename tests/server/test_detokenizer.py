"""IncrementalDetokenizer: deltas that add up to the right text, UTF-8 safety, stop strings, special tokens."""

from __future__ import annotations

import pytest

from tests.server.tokenizer_fixtures import byte_level_tokenizer, sentencepiece_like_tokenizer
from tokenspeed.runtime.engine.detokenizer import IncrementalDetokenizer
from tokenspeed.sampling_params import SamplingParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "café naïve résumé — über straße, 東京 and 🎉 emoji 🎉🎉",
    "  leading spaces, trailing ones  ",
    "Hello world!\nNew line and\ttab.",
]


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def tokenizer(request):
    return byte_level_tokenizer() if request.param == "byte_level" else sentencepiece_like_tokenizer()


def _stream(detok: IncrementalDetokenizer, ids: list[int], step: int = 1) -> tuple[list[str], bool]:
    deltas = []
    for i in range(0, len(ids), step):
        delta, stopped = detok.append(ids[i : i + step])
        deltas.append(delta)
        if stopped:
            return deltas, True
    deltas.append(detok.flush())
    return deltas, False


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 3])
def test_deltas_add_up_to_the_decoded_text(tokenizer, text, step):
    prompt = "Prompt: say something. "
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    out_ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, SamplingParams())
    deltas, stopped = _stream(detok, out_ids, step)
    assert not stopped
    # What the output reads as after the prompt (SentencePiece keeps the leading "▁" as a space there).
    expected = tokenizer.decode(prompt_ids + out_ids)[len(tokenizer.decode(prompt_ids)) :]
    assert "".join(deltas) == expected
    assert detok.text == expected
    # A partial multi-byte character is never shown.
    assert all("\ufffd" not in d for d in deltas)
    assert detok.output_ids == out_ids


def test_leading_space_survives_sentencepiece_decode():
    tok = sentencepiece_like_tokenizer()
    prompt_ids = tok.encode("Hello", add_special_tokens=False)
    full_ids = tok.encode("Hello world", add_special_tokens=False)
    assert full_ids[: len(prompt_ids)] == prompt_ids
    out_ids = full_ids[len(prompt_ids) :]
    detok = IncrementalDetokenizer(tok, prompt_ids, SamplingParams())
    text = "".join(_stream(detok, out_ids)[0])
    # Decoding the output alone would drop the space; the prompt context keeps it.
    assert text == " world"


def test_multibyte_character_is_held_until_complete():
    tok = byte_level_tokenizer()
    ids = tok.encode("🎉", add_special_tokens=False)
    assert len(ids) > 1, "the emoji must span several byte-level tokens for this test to mean anything"
    detok = IncrementalDetokenizer(tok, [], SamplingParams())
    partial = [detok.append([i])[0] for i in ids[:-1]]
    assert "".join(partial) == ""
    assert detok.append([ids[-1]]) == ("🎉", False)


def test_invalid_bytes_are_released_at_the_end():
    tok = byte_level_tokenizer()
    lone = tok.encode("é", add_special_tokens=False)
    assert len(lone) >= 1
    # Only the first byte of a two-byte character: never completes, shown (as U+FFFD) only when final.
    first_byte = tok.convert_tokens_to_ids(["Ã"])
    detok = IncrementalDetokenizer(tok, [], SamplingParams())
    assert detok.append(first_byte) == ("", False)
    assert detok.append([], final=True)[0] == tok.decode(first_byte)


@pytest.mark.parametrize("step", [1, 2, 5])
def test_stop_string_is_excluded_and_detected_across_tokens(tokenizer, step):
    text = "The quick brown fox jumps over the lazy dog."
    ids = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(stop=["fox jumps", "never"])
    detok = IncrementalDetokenizer(tokenizer, [], params)
    deltas, stopped = _stream(detok, ids, step)
    assert stopped
    assert detok.matched_stop == "fox jumps"
    assert "".join(deltas).strip() == "The quick brown"
    assert detok.text == "".join(deltas)
    # After the stop, nothing more comes out.
    assert detok.append(ids[:2]) == ("", True)


def test_possible_stop_prefix_is_held_back_then_released(tokenizer):
    params = SamplingParams(stop=["brown cow"])
    detok = IncrementalDetokenizer(tokenizer, [], params)
    ids = tokenizer.encode("The quick brown fox", add_special_tokens=False)
    split = next(k for k in range(len(ids)) if tokenizer.decode(ids[:k]).endswith("brown"))
    shown = "".join(detok.append([tid])[0] for tid in ids[:split])
    # "brown" could still become "brown cow": held back.
    assert shown.strip() == "The quick"
    delta, stopped = detok.append(ids[split:])
    assert not stopped
    assert (shown + delta).strip() == "The quick brown fox"


def test_earliest_of_several_stop_strings_wins(tokenizer):
    ids = tokenizer.encode("Hello world! This is a tiny tokenizer", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["tiny", "world"]))
    deltas, stopped = _stream(detok, ids, 100)
    assert stopped and detok.matched_stop == "world"
    assert "".join(deltas) == "Hello "


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(tokenizer, skip):
    ids = tokenizer.encode("Hello world", add_special_tokens=False) + [tokenizer.eos_token_id]
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(skip_special_tokens=skip))
    text = "".join(_stream(detok, ids)[0])
    assert text.endswith("</s>") is (not skip)
    assert text.startswith("Hello")


def test_without_tokenizer_only_ids_are_tracked():
    detok = IncrementalDetokenizer(None, [1, 2, 3], SamplingParams(stop=["x"]))
    assert detok.append([5, 6]) == ("", False)
    assert detok.output_ids == [5, 6]
    assert detok.flush() == ""
