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

from tokenspeed.runtime.kernels import fp8_gemm
from tokenspeed.runtime.kernels.decode_attention import decode_attention
from tokenspeed.runtime.kernels.extend_attention import extend_attention
from tokenspeed.runtime.layers.quantization.fp8_math import dequantize, quantize_block, quantize_per_channel
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
        q, xs = quantize_block(x, (1, 128))  # the activations' per-group quantization
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


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps({**block_gemm(), **fused_moe(), **attention()}))
