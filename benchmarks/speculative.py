"""Speculative decoding on the CPU: the `demo` model plain, with its trained EAGLE3 draft, and with NGRAM.

The offline Engine runs the same prompts (paragraph openings and chat questions the demo model was not
trained on) three ways, greedy: plain decoding, EAGLE3 with the shipped draft (tokenspeed/assets/demo-eagle3,
4 draft tokens a step) and NGRAM prompt lookup (4 draft tokens a step). Each runs twice: one request at a
time (batch 1, where drafting pays most) and all prompts at once. Reported: output tokens/s (best of
--repeats), the mean acceptance length (tokens emitted per verify forward: accepted drafts + 1, vLLM's
definition, from the engine's counters), the speedup over plain, and whether every output equals plain
greedy token for token (speculation must never change greedy output). Writes
benchmarks/results/speculative_cpu.json.

    python benchmarks/speculative.py [--max-new-tokens 64] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cpu_common import best, machine  # noqa: E402
from tokenspeed import Engine  # noqa: E402
from tokenspeed.bench_results import write_results  # noqa: E402
from tokenspeed.demo_models import ASSETS_DIR, demo_model_path  # noqa: E402

DRAFT = ASSETS_DIR / "demo-eagle3"
NUM_DRAFTS = 4
TEXT_PROMPTS = (
    "To open a file,",
    "When an exception is raised",
    "The Python interpreter",
    "A list is",
    "In this tutorial, you will learn",
    "The weather today is",
    "The following example shows",
    "If the argument is omitted,",
    "This module provides",
    "Unlike other languages,",
    "The return value is",
    "A class can define",
)
CHAT_QUESTIONS = (
    "What is a dictionary?",
    "How do I read a file?",
    "What does the function json.dumps do?",
    "Tell me about regular expressions.",
)
VARIANTS = {
    "plain": {},
    "eagle3": dict(
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=str(DRAFT),
        speculative_num_steps=NUM_DRAFTS,
        speculative_num_draft_tokens=NUM_DRAFTS + 1,
    ),
    "ngram": dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=NUM_DRAFTS + 1),
}


def prompts() -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_model_path("demo"))
    chats = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in CHAT_QUESTIONS
    ]
    return list(TEXT_PROMPTS) + chats


def spec_counts(engine: Engine) -> tuple[int, int]:
    stats = engine.get_stats()
    return stats.spec_num_drafts, stats.spec_num_accepted_tokens


def timed_run(engine: Engine, prompts: list, params: dict, one_at_a_time: bool, field: str = "prompt"):
    """(seconds, outputs, verify forwards with drafts, accepted drafts) of one pass over the prompts (texts,
    or token id lists with `field="input_ids"`)."""
    drafts0, accepted0 = spec_counts(engine)
    start = time.perf_counter()
    if one_at_a_time:
        outs = [engine.generate(**{field: [p]}, sampling_params=params)[0] for p in prompts]
    else:
        outs = engine.generate(**{field: prompts}, sampling_params=params)
    seconds = time.perf_counter() - start
    drafts1, accepted1 = spec_counts(engine)
    return seconds, [o["output_ids"] for o in outs], drafts1 - drafts0, accepted1 - accepted0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="timed passes per mode; the fastest counts")
    # One thread: on a small busy machine a second torch thread mostly waits for the core the other holds.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "speculative_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    texts = prompts()
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0}

    results: dict[str, dict] = {}
    reference: dict[str, list[list[int]]] = {}
    # plain first: the other variants are compared with its outputs
    variants = {"plain": {}} | {name: VARIANTS[name] for name in args.variants}
    for name, extra in variants.items():
        results[name] = {}
        with Engine(model="demo", device="cpu", dtype="float32", **extra) as engine:
            engine.generate(prompt=texts[:2], sampling_params={"max_new_tokens": 4, "temperature": 0.0})
            for mode, one in (("batch1", True), ("batched", False)):
                seconds, outs, drafts, accepted = best(
                    args.repeats, lambda one=one: timed_run(engine, texts, params, one), before=engine.flush_cache
                )
                tokens = sum(len(o) for o in outs)
                if name == "plain":
                    reference[mode] = outs
                differing = [i for i, (o, r) in enumerate(zip(outs, reference[mode], strict=True)) if o != r]
                results[name][mode] = {
                    "seconds": round(seconds, 3),
                    "output_tokens": tokens,
                    "tokens_per_s": round(tokens / seconds, 1),
                    "verify_forwards_with_drafts": drafts,
                    "accepted_draft_tokens": accepted,
                    "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
                    "outputs_equal_plain": not differing,
                    "prompts_differing_from_plain": differing,
                }
    for name in variants:
        for mode in ("batch1", "batched"):
            r = results[name][mode]
            r["speedup"] = round(r["tokens_per_s"] / results["plain"][mode]["tokens_per_s"], 2)

    report = {
        "benchmark": "speculative_cpu",
        "model": "demo",
        "draft": "tokenspeed/assets/demo-eagle3",
        "draft_tokens_per_step": NUM_DRAFTS,
        "num_prompts": len(texts),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        **machine(args.threads),
        **results,
    }
    print(f"{'':8}{'mode':>9}{'tokens/s':>10}{'speedup':>9}{'accept len':>12}{'= plain':>9}")
    for name in variants:
        for mode in ("batch1", "batched"):
            r = results[name][mode]
            acc = "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
            print(
                f"{name:8}{mode:>9}{r['tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x{acc:>12}"
                f"{'yes' if r['outputs_equal_plain'] else 'NO':>9}"
            )
    write_results(args.out, report)


if __name__ == "__main__":
    main()
