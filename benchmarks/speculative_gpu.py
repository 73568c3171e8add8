"""Speculative decoding step times on the GPU: Llama-3.1-8B shape (dummy bf16 weights) with an EAGLE3-shaped
draft (one decoder layer of the 8B width over 3 captured target states, 32k draft vocabulary, random
weights), against plain decoding, in one run per attention backend.

Per batch size (requests) and attention backend, on one engine (`--speculative-algorithm EAGLE3`, so the
target's graphs also store the 3 captured states, as a serving EAGLE3 server's do):
- `plain_ms`: a plain decode step, one token per request, CUDA graph (host planning included);
- `verify_ms`: a verify step of `k+1` tokens per request (the last token and k drafts), laid out as a decode
  of its tokens and replayed from a CUDA graph, as the engine runs it; `verify_eager_ms`: the same step in
  the extend layout without graphs (how verify ran before verify graphs); the goal is
  verify_ms / plain_ms <= 1.15 at batch 1 for 5 tokens;
- `draft_step_ms`: one chain step of the draft (one row per request, graph); `draft_catchup_ms`: the
  draft's pass over the k+1 positions a verify computed (fc projection eagerly, then the graph);
- `cycle_ms`: draft catch-up, k-1 chain steps and the verify, each read back to the host the way the
  engine does (its wall time on the host); `plain_sync_ms` is a plain step read back the same way;
- per synthetic acceptance length L (tokens a cycle emits): `ms_per_token` = cycle_ms / L and the
  speedup against plain decoding, plain_sync_ms / ms_per_token;
- `engine_spec_step_ms` / `engine_plain_step_ms`: the engine's whole step (`EngineCore.step`, host work
  included) for the same batch of greedy requests, speculating (random draft: acceptance about 1) and with
  drafting switched off on the same engine (synchronous steps, as speculation runs), and per acceptance L
  the time per token and speedup they imply (`engine_per_acceptance`).
Step times are medians of CUDA-event timings (`gc.time_cuda`); the bandwidth limit of a step is the
weights plus the K/V it reads over the device-to-device copy bandwidth measured in the same run.
The logits of the graphed verify and draft steps are compared with their eager counterparts (max
difference and argmax agreement) so a wrong graph shows here too. Writes
benchmarks/results/gpu_speculative.json (after each backend, so a timeout keeps what finished).

    python benchmarks/speculative_gpu.py [--backends triton flashinfer] [--batch-sizes 1 4 16] [--context 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_common as gc  # noqa: E402
from benchmarks.decode import time_back_to_back  # noqa: E402

DRAFT_VOCAB = 32000
AUX_LAYERS = [1, 15, 28]  # EAGLE3's default for 32 layers (1, N/2 - 1, N - 4)
ACCEPTANCE = [1.5, 2.5, 3.5]


def write_draft(target: dict, seed: int = 0) -> str:
    """An EAGLE3 draft folder for `target` (HF layout), random bf16 weights with a small init."""
    from safetensors.torch import save_file

    h, inter = target["hidden_size"], target["intermediate_size"]
    heads, kv, hd = target["num_attention_heads"], target["num_key_value_heads"], target["head_dim"]
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device="cuda") * 0.02).to(torch.bfloat16).cpu()

    ones = torch.ones(h, dtype=torch.bfloat16)
    tensors = {
        "fc.weight": rand(h, len(AUX_LAYERS) * h),
        "midlayer.input_layernorm.weight": ones,
        "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.self_attn.q_proj.weight": rand(heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, heads * hd),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "midlayer.mlp.gate_proj.weight": rand(inter, h),
        "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "norm.weight": ones.clone(),
        "lm_head.weight": rand(DRAFT_VOCAB, h),
        "d2t": torch.zeros(DRAFT_VOCAB, dtype=torch.int64),
    }
    path = Path(tempfile.mkdtemp(prefix="tokenspeed-eagle3-8b-"))
    save_file(tensors, str(path / "model.safetensors"))
    cfg = {
        k: target[k]
        for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                  "rms_norm_eps", "vocab_size", "max_position_embeddings", "rope_theta", "rope_scaling")
    }  # fmt: skip
    cfg.update(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_act="silu", num_hidden_layers=1,
        draft_vocab_size=DRAFT_VOCAB, torch_dtype="bfloat16",
        eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS},
    )  # fmt: skip
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def flat_batch(runner, pool, attn, bs: int, context: int, n: int, first: int = 0, verify: bool = False):
    """Rows for positions context+first .. context+first+n-1 of requests 0..bs-1, one decode row per
    position (the engine's layout of verify and draft forwards); the table rows come from
    `gc.synthetic_batch`, which must have covered them."""
    from tokenspeed.runtime.execution.forward_batch import ForwardBatch

    table = runner.req_to_token.table
    dev = table.device
    rows = torch.arange(bs, device=dev).repeat_interleave(n)
    pos = context + first + torch.arange(n, device=dev).repeat(bs)
    seq = (pos + 1).to(torch.int32)
    return ForwardBatch(
        input_ids=torch.randint(0, runner.model_config.vocab_size, (bs * n,), device=dev),
        positions=pos,
        out_cache_loc=table[rows, pos].long(),
        req_pool_indices=rows.to(torch.int32),
        seq_lens=seq,
        extend_lens=torch.ones(bs * n, dtype=torch.int32, device=dev),
        extend_prefix_lens=pos.to(torch.int32),
        logits_indices=torch.arange(bs * n, device=dev),
        req_to_token=table,
        kv_pool=pool,
        attn_backend=attn,
        seq_lens_cpu=seq.tolist(),
        extend_lens_cpu=[1] * (bs * n),
        is_decode_only=True,
        is_verify=verify,
    )


def host_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median wall milliseconds of `fn()`, which reads its result back to the host (so it waits)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    return {
        "max_abs_diff": round(float((a - b).abs().max()), 5),
        "ref_abs_max": round(float(b.abs().max()), 5),
        "argmax_agree": round(float((a.argmax(-1) == b.argmax(-1)).float().mean()), 4),
    }


def bench_backend(
    model_dir: str, draft_dir: str, backend: str, sizes: list[int], ctx: int, k1: int, bw: float
):
    # verify graphs hold b * k1 rows; explicit sizes so each measured batch replays without padding
    capture = sorted(set(sizes) | {b * k1 for b in sizes})
    core = gc.make_core(
        model_dir, attention_backend=backend, sampling_backend="greedy", max_num_seqs=max(capture),
        cudagraph_capture_sizes=capture, max_total_tokens=max(sizes) * (ctx + 64) + 4096, max_model_len=ctx + 64,
        speculative_algorithm="EAGLE3", speculative_draft_model_path=draft_dir, speculative_num_draft_tokens=k1,
    )  # fmt: skip
    runner, prop = core.runner, core.proposer
    gr = runner.graph_runner
    print(
        f"{backend}: target graphs {gr.sizes if gr else None} (aux layers {gr.aux_layers if gr else None}); "
        f"draft graphs {prop.graphs.runner.sizes if prop.graphs else None}"
    )
    gc.fill_kv_random(runner.kv_pool)
    gc.fill_kv_random(prop.pool)
    per_token_kv = runner.kv_pool.spec.bytes_per_token()
    wbytes = gc.weight_bytes_read(runner.model)
    # the draft reads all its weights but the embedding (the target's, gathered by row)
    dbytes = sum(p.numel() * p.element_size() for n, p in prop.model.named_parameters() if "embed" not in n)
    hidden = runner.model_config.hidden_size
    rows = []
    for bs in sizes:
        row = dict(backend=backend, batch=bs, context=ctx, tokens_per_verify=k1)
        try:
            extend_fb = gc.synthetic_batch(runner, bs, ctx, new_tokens=k1)  # fills the table for k1 positions
            plain_fb = gc.synthetic_batch(runner, bs, ctx)
            gc.synthetic_batch(runner, bs, ctx, new_tokens=k1)  # (the table again, as plain_fb cut it)
            verify_fb = flat_batch(runner, runner.kv_pool, runner.attn_backend, bs, ctx, k1, verify=True)
            extend_fb.input_ids.copy_(verify_fb.input_ids)
            extend_fb.logits_indices = torch.arange(bs * k1, device=extend_fb.input_ids.device)
            assert gr is not None and gr.can_run(plain_fb) and gr.can_run(verify_fb), "no graph for the step"
            with torch.inference_mode():
                got = runner.run(verify_fb).clone()
                want = runner.run(extend_fb, use_graphs=False)
                row["verify_graph_vs_eager_extend"] = compare(got, want)
                replays = runner.graph_use.verify_replays

                def step(fb, graphs=True):
                    return lambda: torch.argmax(runner.run(fb, use_graphs=graphs), dim=-1)

                plain_ms = gc.time_cuda(step(plain_fb)) * 1e3
                verify_ms = gc.time_cuda(step(verify_fb)) * 1e3
                row.update(
                    plain_ms=round(plain_ms, 4),
                    plain_b2b_ms=round(time_back_to_back(step(plain_fb)) * 1e3, 4),
                    verify_ms=round(verify_ms, 4),
                    verify_b2b_ms=round(time_back_to_back(step(verify_fb)) * 1e3, 4),
                    verify_eager_ms=round(gc.time_cuda(step(extend_fb, False), iters=10) * 1e3, 4),
                    verify_over_plain=round(verify_ms / plain_ms, 4),
                    verify_replays_while_timed=runner.graph_use.verify_replays - replays,
                )
                kv1 = bs * (ctx + 1) * per_token_kv
                row["plain_limit_ms"] = round((wbytes + kv1) / bw * 1e3, 4)
                row["plain_ratio"] = round(row["plain_limit_ms"] / plain_ms, 4)
                # verify reads the weights once and each request's K/V once (ideally), k1 tokens more
                row["verify_limit_ms"] = round((wbytes + bs * (ctx + k1) * per_token_kv) / bw * 1e3, 4)
                row["verify_ratio"] = round(row["verify_limit_ms"] / verify_ms, 4)
                if prop.graphs is not None:
                    row.update(draft_times(runner, prop, bs, ctx, k1, hidden))
                    row["draft_limit_ms"] = round(dbytes / bw * 1e3, 4)
                    row.update(cycle(runner, prop, plain_fb, verify_fb, bs, ctx, k1, hidden))
            # the whole engine step, host work included: speculating, then with drafting switched off
            row.update(engine_steps(core, bs, ctx, 24, "spec"))
            core.proposer = None
            try:
                row.update(engine_steps(core, bs, ctx, 24, "plain"))
            finally:
                core.proposer = prop
            if row.get("engine_plain_step_ms"):
                row["engine_per_acceptance"] = {
                    str(acc): dict(
                        ms_per_token=round(row["engine_spec_step_ms"] / acc, 4),
                        speedup=round(row["engine_plain_step_ms"] * acc / row["engine_spec_step_ms"], 3),
                    )
                    for acc in ACCEPTANCE
                }
        except Exception as e:  # one failed size must not lose the others: print all that helps
            traceback.print_exc()
            row["error"] = repr(e)
        rows.append(row)
        print(
            f"{backend:10s} bs={bs:3d} "
            + " ".join(f"{k}={v}" for k, v in row.items() if k not in ("backend", "batch"))
        )
    row_use = dict(backend=backend, graph_use=vars(runner.graph_use).copy())
    print(f"{backend}: graph use {row_use['graph_use']}")
    core.shutdown()
    core = runner = prop = None
    gc.gc_collect_cuda()
    return rows + [row_use]


def engine_steps(core, bs: int, ctx: int, new_tokens: int, tag: str) -> dict:
    """Median wall time of the engine's steps (`core.step()`: scheduling, prepare, graphs, verification,
    drafting, all host work) for `bs` greedy requests of `ctx` random prompt tokens (prefill steps are few
    and the median leaves them out), and the acceptance length measured (random draft weights: about 1)."""
    from tokenspeed.runtime.engine.io_struct import GenerateRequest

    gen = torch.Generator().manual_seed(bs)
    stats = core.spec_stats
    drafts, accepted = stats.num_drafts, stats.num_accepted_tokens
    sampling = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
    for i in range(bs):
        ids = torch.randint(0, core.model_config.vocab_size, (ctx,), generator=gen).tolist()
        core.add_request(GenerateRequest(f"{tag}-{bs}-{i}", ids, dict(sampling)))
    times = []
    while core.has_unfinished() and len(times) < 4 * new_tokens:
        t = time.perf_counter()
        core.step()
        times.append(time.perf_counter() - t)
    n = stats.num_drafts - drafts
    return {
        f"engine_{tag}_step_ms": round(statistics.median(times) * 1e3, 4),
        f"engine_{tag}_steps": len(times),
        f"engine_{tag}_acceptance": round(1 + (stats.num_accepted_tokens - accepted) / n, 3) if n else None,
    }


def draft_times(runner, prop, bs: int, ctx: int, k1: int, hidden: int) -> dict:
    g = prop.graphs
    chain_fb = flat_batch(runner, prop.pool, prop.attn, bs, ctx, 1)
    catch_fb = flat_batch(runner, prop.pool, prop.attn, bs, ctx, k1)
    dev = chain_fb.input_ids.device
    h = torch.randn(bs, hidden, dtype=torch.bfloat16, device=dev) * 0.5
    aux = torch.randn(bs * k1, len(AUX_LAYERS) * hidden, dtype=torch.bfloat16, device=dev) * 0.5
    out = {}
    with torch.inference_mode():
        got = g.run(chain_fb, h)[1].clone()
        prop.attn.init_forward_metadata(chain_fb)
        want = prop.model(chain_fb, h, from_target=False)[1]
        out["draft_graph_vs_eager"] = compare(got, want)
        out["draft_step_ms"] = round(gc.time_cuda(lambda: torch.argmax(g.run(chain_fb, h)[1], -1)) * 1e3, 4)
        out["draft_catchup_ms"] = round(
            gc.time_cuda(lambda: torch.argmax(g.run(catch_fb, prop.model.project(aux))[1], -1)) * 1e3, 4
        )
        prop.attn.init_forward_metadata(chain_fb)
        out["draft_step_eager_ms"] = round(
            gc.time_cuda(lambda: prop.model(chain_fb, h, from_target=False), iters=10) * 1e3, 4
        )
    return out


def cycle(runner, prop, plain_fb, verify_fb, bs: int, ctx: int, k1: int, hidden: int) -> dict:
    """One draft+verify cycle read back as the engine does (host waits after each draft step)."""
    g = prop.graphs
    dev = verify_fb.input_ids.device
    catch_fb = flat_batch(runner, prop.pool, prop.attn, bs, ctx, k1)
    chains = [flat_batch(runner, prop.pool, prop.attn, bs, ctx, 1, first=j) for j in range(1, k1 - 1)]
    aux = torch.randn(bs * k1, len(AUX_LAYERS) * hidden, dtype=torch.bfloat16, device=dev) * 0.5
    last = torch.arange(bs, device=dev) * k1 + k1 - 1

    def one_cycle():
        h_all, logits = g.run(catch_fb, prop.model.project(aux))
        h = h_all[last]
        logits[last].argmax(-1).tolist()
        for fb in chains:
            h_new, logits = g.run(fb, h)
            h = h_new.clone()
            logits.argmax(-1).tolist()
        runner.run(verify_fb).argmax(-1).tolist()

    with torch.inference_mode():
        plain_sync = host_ms(lambda: runner.run(plain_fb).argmax(-1).tolist())
        cyc = host_ms(one_cycle)
    out = dict(plain_sync_ms=round(plain_sync, 4), cycle_ms=round(cyc, 4), per_acceptance={})
    for acc in ACCEPTANCE:
        per_tok = cyc / acc
        out["per_acceptance"][str(acc)] = dict(
            ms_per_token=round(per_tok, 4), speedup=round(plain_sync / per_tok, 3)
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["triton", "flashinfer"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--num-draft-tokens", type=int, default=5, help="tokens a verify computes per request")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_speculative.json"))
    args = ap.parse_args()
    bw = gc.copy_bandwidth()
    print(f"device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s (read + write)")
    model_dir = gc.write_config(gc.LLAMA_8B, "llama8b")
    draft_dir = write_draft(gc.LLAMA_8B)
    result = dict(
        benchmark="speculative",
        model="Llama-3.1-8B shape, dummy bf16 weights; EAGLE3-shaped draft (1 layer, 3 captured states, 32k vocab)",
        device=gc.device_info(),
        copy_bandwidth_tb_s=round(bw / 1e12, 4),
        goal="verify of 5 tokens <= 1.15x a plain decode step at batch 1",
        rows=[],
    )
    for backend in args.backends:
        try:
            result["rows"] += bench_backend(
                model_dir, draft_dir, backend, args.batch_sizes, args.context, args.num_draft_tokens, bw
            )
        except Exception as e:
            traceback.print_exc()
            result["rows"].append(dict(backend=backend, error=repr(e)))
        gc.save_json(args.out, result)
    for r in result["rows"]:
        if r.get("batch") == 1 and "verify_over_plain" in r:
            ok = r["verify_over_plain"] <= 1.15
            print(
                f"goal {r['backend']}: verify/plain at bs1 = {r['verify_over_plain']} ({'met' if ok else 'NOT met'})"
            )


if __name__ == "__main__":
    main()
