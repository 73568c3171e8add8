"""The RoPE kernels (`fused_ops.apply_rope`, `rope_store.rope_store_kv`), run by Triton's interpreter on the
CPU (`TRITON_INTERPRET=1`, set by tests/engine/test_rope_triton_interpreter.py before Triton is imported):
prints one JSON object, per case, of whether each kernel's output equals what it must equal.

- `apply_rope` against the PyTorch rotation (`rotary.apply_rotary` on the CPU), float32 and float16: the
  kernel rounds where the reference rounds, so the outputs are the same bits (bfloat16, the models' dtype,
  is not checked here: the interpreter computes through NumPy, which has no bfloat16, and reads garbage);
- `rope_store_kv` against `apply_rope` then `store_kv`, the two launches it fuses: the same bits in the
  returned q and k and in the K/V pool;
- `rope_store_kv` with Qwen3's q/k norms against the PyTorch RMSNorm (`RMSNorm._norm`) of each head, then
  the PyTorch rotation and `store_kv`: within a rounding (the kernel adds the two halves' sums of squares).

q, k and v are strided views of one QKV row, as the model's split makes them. This checks the kernels'
indexing and rounding, not the GPU code generation; tests/gpu/test_fused_ops.py covers that on a device.
"""

from __future__ import annotations

import json

import torch

from tokenspeed.runtime.kernels.fused_ops import apply_rope
from tokenspeed.runtime.kernels.kv_store import store_kv
from tokenspeed.runtime.kernels.rope_store import rope_store_kv
from tokenspeed.runtime.layers import rotary
from tokenspeed.runtime.layers.norm import RMSNorm


def _inputs(dtype: torch.dtype, head_dim: int, t: int = 7, h: int = 4, kvh: int = 2):
    qkv = torch.randn(t, (h + 2 * kvh) * head_dim, dtype=dtype)
    q, k, v = qkv.split([h * head_dim, kvh * head_dim, kvh * head_dim], dim=-1)
    q, k, v = (x.reshape(t, -1, head_dim) for x in (q, k, v))
    emb = rotary.RotaryEmbedding(head_dim, 512, {"rope_theta": 10000.0, "rope_type": "default"})
    emb.init_buffers()
    return emb.cos_sin(torch.randint(0, 512, (t,)), dtype), q, k, v


def check(dtype: torch.dtype, head_dim: int) -> dict[str, bool]:
    cos_sin, q, k, v = _inputs(dtype, head_dim)
    ref_q, ref_k = rotary.apply_rotary(cos_sin, q, k)  # the PyTorch path on the CPU
    got_q, got_k = apply_rope(cos_sin, q, k)
    slots, kvh = 13, k.shape[1]
    loc = torch.randperm(slots - 1)[: q.shape[0]] + 1
    k_ref, v_ref, k_buf, v_buf = (torch.zeros(slots, kvh, head_dim, dtype=dtype) for _ in range(4))
    store_kv(got_k, v, k_ref, v_ref, loc)
    fused_q, fused_k = rope_store_kv(cos_sin, q, k, v, k_buf, v_buf, loc)
    # Qwen3's per-head norms, fused: against the PyTorch norm, rotation and store
    q_norm, k_norm = RMSNorm(head_dim), RMSNorm(head_dim)
    for norm in (q_norm, k_norm):
        norm.weight.data = (torch.rand(head_dim) + 0.5).to(dtype)
    nq_ref, nk_ref = rotary.apply_rotary(cos_sin, q_norm._norm(q), k_norm._norm(k))
    kn_ref, vn_ref, kn_buf, vn_buf = (torch.zeros(slots, kvh, head_dim, dtype=dtype) for _ in range(4))
    store_kv(nk_ref, v, kn_ref, vn_ref, loc)
    nq, nk = rope_store_kv(cos_sin, q, k, v, kn_buf, vn_buf, loc, (q_norm.weight, k_norm.weight, q_norm.eps))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=4e-3, atol=4e-3)
    return {
        "apply_rope": torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k),
        "rope_store_kv": torch.equal(fused_q, got_q) and torch.equal(fused_k, got_k)
        and torch.equal(k_buf, k_ref) and torch.equal(v_buf, v_ref),
        "rope_store_kv_qk_norm": torch.allclose(nq, nq_ref, **tol) and torch.allclose(nk, nk_ref, **tol)
        and torch.allclose(kn_buf, kn_ref, **tol) and torch.equal(vn_buf, vn_ref),
    }  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    results = {
        f"{str(dtype).removeprefix('torch.')}_d{d}": check(dtype, d)
        for dtype in (torch.float32, torch.float16)
        for d in (16, 64)
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
