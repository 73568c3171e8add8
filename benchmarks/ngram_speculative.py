"""NGRAM prompt lookup through the offline Engine on a repetitive prompt set, against plain decoding.

Prompt lookup pays where the answer repeats what came before (code edits, extraction, agent loops). Each
prompt here is a random phrase of 8-24 tokens repeated to `--prompt-len`, and greedy decoding runs
`--max-new-tokens` tokens (EOS ignored) plain and with `--speculative-algorithm NGRAM`, one request at a
time and `--batch` requests at once, on the same weights. Reported per mode: output tokens/s, the mean
acceptance length (tokens a verify forward emits: accepted drafts + 1, vLLM's definition, from the
engine's counters), the speed-up over plain, and whether every output equals plain greedy (speculation
must not change greedy output; FlashInfer's bf16 verify may flip a near-tie, so a difference is reported,
not hidden). On the GPU the default model is the Llama-3.1-8B shape with dummy bf16 weights: what its
greedy decoding repeats is whatever random weights repeat, so the acceptance is the workload's, not a
trained model's; the step costs are the real ones. `--model demo --device cpu` runs the same path on the
CPU (a dry run in CI). Writes benchmarks/results/gpu_ngram.json.

    python benchmarks/ngram_speculative.py [--attention-backend triton] [--batch 16] [--out PATH]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.speculative import timed_run  # noqa: E402
from tokenspeed.bench_results import write_results  # noqa: E402


def repetitive_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts, each a random phrase of 8-24 tokens repeated (and cut) to `length` tokens."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        phrase = [rng.randrange(5, vocab) for _ in range(rng.randint(8, 24))]
        prompts.append((phrase * (length // len(phrase) + 1))[:length])
    return prompts


def timed(engine, prompts: list[list[int]], params: dict, one_at_a_time: bool) -> dict:
    seconds, outputs, drafts, accepted = timed_run(engine, prompts, params, one_at_a_time, field="input_ids")
    tokens = sum(len(o) for o in outputs)
    return dict(
        seconds=round(seconds, 3), output_tokens=tokens, tokens_per_s=round(tokens / seconds, 1),
        verify_forwards_with_drafts=drafts, accepted_draft_tokens=accepted,
        mean_acceptance_length=round(1 + accepted / drafts, 3) if drafts else None,
        outputs=outputs,
    )  # fmt: skip


def engine_args(args: argparse.Namespace) -> tuple[dict, str, int]:
    """(Engine kwargs, the model's description, its vocabulary size)."""
    if args.model == "llama8b":
        from benchmarks import gpu_common as gc

        model_dir = gc.write_config(gc.LLAMA_8B, "llama8b")
        kwargs = dict(model=model_dir, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True)
        return kwargs, "Llama-3.1-8B shape, dummy bf16 weights", gc.LLAMA_8B["vocab_size"]
    from tokenspeed.demo_models import demo_model_path
    from tokenspeed.runtime.models.model_config import ModelConfig

    path = str(demo_model_path(args.model))
    vocab = ModelConfig.from_pretrained(path, dtype="float32", device=args.device).vocab_size
    return dict(model=path, dtype="float32" if args.device == "cpu" else "bfloat16"), args.model, vocab


def main(argv: list[str] | None = None) -> dict:
    from tokenspeed import Engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama8b", help="llama8b (dummy weights, GPU) or a demo model name")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16, help="requests at once in the batched mode")
    ap.add_argument("--num-draft-tokens", type=int, default=5, help="tokens a verify computes per request")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_ngram.json"))
    args = ap.parse_args(argv)

    base, model_name, vocab = engine_args(args)
    base.update(device=args.device, max_model_len=args.prompt_len + args.max_new_tokens + 64)
    if args.attention_backend:
        base["attention_backend"] = args.attention_backend
    prompts = repetitive_prompts(args.prompts, args.prompt_len, vocab)
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0, "ignore_eos": True}
    # "plain_no_overlap" isolates what speculative mode costs before any draft is accepted: drafts need the
    # previous step's tokens, so NGRAM turns the overlap scheduler off.
    variants = {
        "plain": {},
        "plain_no_overlap": dict(disable_overlap_schedule=True),
        "ngram": dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=args.num_draft_tokens),
    }
    results: dict[str, dict] = {}
    for name, extra in variants.items():
        results[name] = {}
        with Engine(**base, **extra) as engine:
            engine.generate(input_ids=prompts[:2], sampling_params={**params, "max_new_tokens": 4})  # warm-up
            for mode, one, group in (("batch1", True, prompts[:4]), ("batched", False, prompts[: args.batch])):
                engine.flush_cache()  # each mode prefills its prompts itself
                results[name][mode] = timed(engine, group, params, one)
    for mode in ("batch1", "batched"):
        plain = results["plain"][mode]
        for name in list(variants)[1:]:
            r = results[name][mode]
            r["speedup"] = round(r["tokens_per_s"] / plain["tokens_per_s"], 3)
            differing = [i for i, (a, b) in enumerate(zip(r["outputs"], plain["outputs"], strict=True)) if a != b]
            r["outputs_equal_plain"] = not differing
            r["prompts_differing_from_plain"] = differing
    for name in variants:
        for mode in ("batch1", "batched"):
            r = results[name][mode]
            r.pop("outputs")
            acc = "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
            extra = f"  speedup {r['speedup']:.2f}x  equal to plain: {r['outputs_equal_plain']}" if "speedup" in r else ""
            print(f"{name:16} {mode:8} {r['tokens_per_s']:9.1f} tok/s  acceptance {acc}{extra}")
    report = dict(
        benchmark="ngram_speculative", model=model_name, device=args.device,
        attention_backend=args.attention_backend or "default", prompts=args.prompts, prompt_len=args.prompt_len,
        max_new_tokens=args.max_new_tokens, batch=args.batch, num_draft_tokens=args.num_draft_tokens,
        results=results,
    )  # fmt: skip
    if args.device != "cpu":
        from benchmarks import gpu_common as gc

        report["device"] = gc.device_info()
    write_results(args.out, report)
    return report


if __name__ == "__main__":
    main()
