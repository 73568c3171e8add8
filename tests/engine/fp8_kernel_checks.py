"""The FP8 paths of the Triton kernels, run by Triton's interpreter on the CPU (`TRITON_INTERPRET=1`, set
by tests/engine/test_fp8_triton_interpreter.py before Triton is imported): prints one JSON object of
relative errors against float32 references of exactly what each kernel is given.

This checks the kernels' indexing and scale arithmetic (float32 activations, the IEEE dot path), not the
GPU code generation; tests/gpu/test_fp8_gpu.py covers that on a device.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tokenspeed.runtime.kernels import fp8_gemm, fp8_quant
from tokenspeed.runtime.kernels.decode_attention import decode_attention
from tokenspeed.runtime.kernels.extend_attention import extend_attention
from tokenspeed.runtime.layers.quantization.fp8_math import (
    FP8_MAX,
    dequantize,
    quantize_block,
    quantize_per_channel,
)
from tokenspeed.runtime.moe.kernels.align import align_by_expert, pairs_as_blocks
from tokenspeed.runtime.moe.kernels.configs import MoeKernelConfig
from tokenspeed.runtime.moe.kernels.gemm import down, gate_up_silu


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def block_gemm() -> dict[str, float]:
    out = {}
    for n, k, m in ((64, 256, 5), (200, 300, 3)):
        w, s = quantize_block(torch.randn(n, k) * 0.05, (128, 128))
        x = torch.randn(m, k)
        # the activations as the GEMM quantizes them (fp8_quant; the interpreter's own e4m3 cast, which
        # rounds a few values unlike the GPU's, is what this kernel is given here)
        q, xs = fp8_quant.quantize_rows(x, group=128)
        x_seen = dequantize(q, xs, (1, 128), torch.float32)  # the activations the kernel multiplies
        ref = F.linear(x_seen, dequantize(w, s, (128, 128), torch.float32))
        out[f"block_gemm_{n}x{k}_m{m}"] = _rel(fp8_gemm.block_fp8_matmul(x, w, s, (128, 128)), ref)
    return out


def fused_moe() -> dict[str, float]:
    out = {}
    experts, hidden, inter, tokens, top_k = 4, 64, 32, 5, 2
    w13, w2 = torch.randn(experts, 2 * inter, hidden) * 0.05, torch.randn(experts, hidden, inter) * 0.05
    x = torch.randn(tokens, hidden)
    weights, ids = torch.softmax(torch.randn(tokens, experts), -1).topk(top_k, dim=-1)
    ids, flat = ids.to(torch.int32).contiguous(), weights.float().contiguous().view(-1)
    for cfg in (MoeKernelConfig(pairs=True, block_n=32), MoeKernelConfig(block_m=16)):
        al = pairs_as_blocks(ids, cfg.block_m) if cfg.pairs else align_by_expert(ids, experts, cfg.block_m)
        for label, block in (("channel", None), ("block16", (16, 16))):
            quant = quantize_per_channel if block is None else (lambda t, b=block: quantize_block(t, b))
            (q13, s13), (q2, s2) = quant(w13), quant(w2)
            d13, d2 = dequantize(q13, s13, block, torch.float32), dequantize(q2, s2, block, torch.float32)
            act = gate_up_silu(x, q13, al, top_k, cfg, (s13, block))
            per_pair = down(act, q2, al, flat, cfg, (s2, block))
            worst = 0.0
            for t in range(tokens):
                for j in range(top_k):
                    e, p = int(ids[t, j]), t * top_k + j
                    gate_up = F.linear(x[t], d13[e])
                    y = F.linear(F.silu(gate_up[:inter]) * gate_up[inter:], d2[e]) * flat[p]
                    worst = max(worst, _rel(per_pair[p], y))
            out[f"moe_{'pairs' if cfg.pairs else 'grouped'}_{label}"] = worst
    return out


def attention() -> dict[str, float]:
    heads, kv_heads, dim, seq = 4, 2, 32, 40
    k_scale, v_scale = 0.05, 0.02
    k, v = torch.randn(64, kv_heads, dim), torch.randn(64, kv_heads, dim)
    k_buf = (k / k_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    v_buf = (v / v_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    k_seen, v_seen = k_buf.float() * k_scale, v_buf.float() * v_scale
    table = torch.arange(64, dtype=torch.int32).view(1, 64).contiguous()
    rows, lens = torch.tensor([0], dtype=torch.int32), torch.tensor([seq], dtype=torch.int32)
    scale = dim**-0.5
    keys, values = k_seen[:seq].transpose(0, 1)[None], v_seen[:seq].transpose(0, 1)[None]
    # as the Triton backend calls them: K's scale folded into the softmax scale, V's into the output
    q = torch.randn(1, heads, dim)
    got = torch.empty_like(q)
    mid_o, mid_lse = torch.empty(1, heads, 2, dim), torch.empty(1, heads, 2)
    decode_attention(q, k_buf, v_buf, got, table, rows, lens, mid_o, mid_lse, scale * k_scale, 2)
    ref = F.scaled_dot_product_attention(q.view(1, heads, 1, dim), keys, values, scale=scale, enable_gqa=True)
    out = {"decode_fp8_kv": _rel(got * v_scale, ref.view(1, heads, dim))}
    qe = torch.randn(5, heads, dim)
    got_e = torch.empty_like(qe)
    ext, start = torch.tensor([5], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    extend_attention(qe, got_e, k_buf, v_buf, table, rows, lens, ext, start, 5, scale * k_scale)
    mask = (torch.arange(seq)[None, :] <= torch.arange(seq - 5, seq)[:, None])[None, None]
    ref_e = F.scaled_dot_product_attention(
        qe.transpose(0, 1)[None], keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )[0].transpose(0, 1)
    out["extend_fp8_kv"] = _rel(got_e * v_scale, ref_e)
    out["extend_fresh_over_fp8_prefix"] = extend_fresh(k_scale, v_scale)
    return out


def extend_fresh(k_scale: float, v_scale: float) -> float:
    """Two requests (prefix 35 + 5 new tokens; prefix 10 + 70 new, two query blocks) over an FP8 cache:
    the prefix is read from the cache with its scales, the new tokens' keys from their own K/V unrounded."""
    heads, kv_heads, dim = 4, 2, 32
    prefixes, exts = (35, 10), (5, 70)
    slots = 128
    k_all, v_all = torch.randn(2, slots, kv_heads, dim), torch.randn(2, slots, kv_heads, dim)
    k_buf = (k_all.view(-1, kv_heads, dim) / k_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    v_buf = (v_all.view(-1, kv_heads, dim) / v_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    table = torch.arange(2 * slots, dtype=torch.int32).view(2, slots).contiguous()
    rows = torch.tensor([0, 1], dtype=torch.int32)
    lens = torch.tensor([p + e for p, e in zip(prefixes, exts, strict=True)], dtype=torch.int32)
    ext = torch.tensor(exts, dtype=torch.int32)
    start = torch.tensor([0, exts[0]], dtype=torch.int32)
    # the new tokens' own K/V, in q's rows (what the layer computed; the cache holds them rounded)
    k_new = torch.cat([k_all[b, p : p + e] for b, (p, e) in enumerate(zip(prefixes, exts, strict=True))])
    v_new = torch.cat([v_all[b, p : p + e] for b, (p, e) in enumerate(zip(prefixes, exts, strict=True))])
    q = torch.randn(sum(exts), heads, dim)
    got = torch.empty_like(q)
    scale = dim**-0.5
    extend_attention(q, got, k_buf, v_buf, table, rows, lens, ext, start, max(exts), scale,
                     k_new=k_new, v_new=v_new, k_scale=k_scale, v_scale=v_scale)  # fmt: skip
    worst = 0.0
    for b, (p, e) in enumerate(zip(prefixes, exts, strict=True)):
        cached = k_buf.view(2, slots, kv_heads, dim)[b, :p].float() * k_scale
        cached_v = v_buf.view(2, slots, kv_heads, dim)[b, :p].float() * v_scale
        keys = torch.cat([cached, k_all[b, p : p + e]]).transpose(0, 1)[None]
        values = torch.cat([cached_v, v_all[b, p : p + e]]).transpose(0, 1)[None]
        mask = (torch.arange(p + e)[None, :] <= torch.arange(p, p + e)[:, None])[None, None]
        q0 = int(start[b])
        qb = q[q0 : q0 + e].transpose(0, 1)[None]
        ref = F.scaled_dot_product_attention(qb, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
        worst = max(worst, _rel(got[q0 : q0 + e], ref[0].transpose(0, 1)))
    return worst


def quantize_rows_exact() -> dict[str, float]:
    """`fp8_quant.quantize_rows` against `quantize_per_channel`, the reference, to the bit: the count of
    quotients and scales that differ (0 expected). The kernel stores its clamped float32 quotients here
    (the interpreter's own e4m3 cast rounds some values wrongly; the GPU test compares the e4m3 bytes).
    Rows of zeros, one huge value and a tail past the kernel's block of 2048 included."""
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, k in ((3, 300), (5, 4096), (2, 14336)):
            x = (torch.randn(m, k) * torch.logspace(-3, 2, m)[:, None]).to(dtype)
            x[0] = 0.0  # a row of zeros: the smallest scale, all zeros out
            x[-1, -1] = 3.0e4 if dtype != torch.float16 else 6.0e4
            quotients, s = fp8_quant.quantize_rows(x, dtype=torch.float32)
            _, s_ref = quantize_per_channel(x)
            ref = (x.float() / s_ref).clamp(-FP8_MAX, FP8_MAX)  # what `to_fp8` casts
            off = int((quotients.view(torch.int32) != ref.view(torch.int32)).sum()) + int((s != s_ref).sum())
            # per (token, 128 columns), as the block-wise GEMM quantizes its activations
            g_quotients, g_s = fp8_quant.quantize_rows(x, group=128, dtype=torch.float32)
            _, g_ref_s = quantize_block(x, (1, 128))
            g_ref = (x.float() / g_ref_s.repeat_interleave(128, dim=1)[:, :k]).clamp(-FP8_MAX, FP8_MAX)
            off += int((g_quotients.view(torch.int32) != g_ref.view(torch.int32)).sum())
            off += int((g_s != g_ref_s).sum())
            out[f"quantize_rows_{str(dtype)[6:]}_{k}"] = float(off)
    return out


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps({**block_gemm(), **fused_moe(), **attention(), **quantize_rows_exact()}))
