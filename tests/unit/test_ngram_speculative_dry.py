"""`benchmarks/ngram_speculative.py` on the CPU with the demo model: the path the H200 run takes (the
offline Engine plain and with NGRAM on repetitive prompts), so the device call works on its first try."""

from __future__ import annotations

import json

from benchmarks import ngram_speculative


def test_prompts_repeat_a_phrase_to_the_asked_length():
    prompts = ngram_speculative.repetitive_prompts(3, 100, vocab=1000, seed=1)
    assert [len(p) for p in prompts] == [100, 100, 100]
    for p in prompts:
        period = next(n for n in range(8, 25) if p[n:] == p[:-n])  # a phrase of 8-24 tokens, repeated
        assert p[:period] != p[1 : period + 1]


def test_dry_run_on_the_cpu_writes_plain_and_ngram_with_provenance(tmp_path):
    out = tmp_path / "ngram.json"
    args = ["--model", "demo", "--device", "cpu", "--prompts", "3", "--prompt-len", "48",
            "--max-new-tokens", "12", "--batch", "3", "--out", str(out)]  # fmt: skip
    ngram_speculative.main(args)
    data = json.loads(out.read_text())
    assert data["provenance"]["argv"] and data["provenance"]["time"]
    plain, ngram = data["results"]["plain"], data["results"]["ngram"]
    for mode, requests in (("batch1", 3), ("batched", 3)):
        assert plain[mode]["output_tokens"] == ngram[mode]["output_tokens"] == requests * 12
        assert plain[mode]["verify_forwards_with_drafts"] == 0
        assert ngram[mode]["verify_forwards_with_drafts"] > 0  # NGRAM found the repeated phrase and drafted
        assert ngram[mode]["mean_acceptance_length"] >= 1.0
        assert ngram[mode]["outputs_equal_plain"], ngram[mode]["prompts_differing_from_plain"]  # float32: exact
        assert ngram[mode]["speedup"] > 0
        no_overlap = data["results"]["plain_no_overlap"][mode]
        assert no_overlap["verify_forwards_with_drafts"] == 0
        assert no_overlap["outputs_equal_plain"], no_overlap["prompts_differing_from_plain"]
