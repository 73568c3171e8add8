"""Compile one FlashInfer kernel family ahead of the tests (the device run starts one process per family in
parallel, so their JIT builds overlap): `python tests/gpu/warm_flashinfer.py prefill|decode|sampling`.

The families are the ones TokenSpeed loads with bf16 and head_dim 128: `prefill` is FlashInfer's FA2 batch
prefill module, which serves the paged and ragged prefill wrappers and the tensor-core decode (GQA groups
of 4 or more); `decode` the CUDA-core decode kernel (smaller groups, MHA); `sampling` the sampling kernels.
"""

from __future__ import annotations

import sys
import time

import torch


def main(family: str) -> None:
    import flashinfer

    start = time.perf_counter()
    dev = "cuda"
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    kv = torch.randn(8, 16, 8, 128, device=dev, dtype=torch.bfloat16)
    indptr = torch.tensor([0, 2], dtype=torch.int32)
    idx = torch.tensor([1, 2], dtype=torch.int32, device=dev)
    last = torch.tensor([5], dtype=torch.int32)
    bf16 = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    if family == "prefill":
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
        w.plan(
            torch.tensor([0, 7], dtype=torch.int32), indptr, idx, last, 32, 8, 128, 16, causal=True, **bf16
        )
        w.run(torch.randn(7, 32, 128, device=dev, dtype=torch.bfloat16), (kv, kv))
        r = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa2")
        qo = torch.tensor([0, 7], dtype=torch.int32)
        r.plan(qo, qo, 32, 8, 128, causal=True, **bf16)
        k = torch.randn(7, 8, 128, device=dev, dtype=torch.bfloat16)
        r.run(torch.randn(7, 32, 128, device=dev, dtype=torch.bfloat16), k, k)
        d = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True, backend="fa2")
        d.plan(indptr, idx, last, 32, 8, 128, 16, **bf16)
        d.run(torch.randn(1, 32, 128, device=dev, dtype=torch.bfloat16), (kv, kv))
    elif family == "decode":
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=False)
        w.plan(indptr, idx, last, 8, 8, 128, 16, **bf16)
        w.run(torch.randn(1, 8, 128, device=dev, dtype=torch.bfloat16), (kv, kv))
    elif family == "sampling":
        import flashinfer.sampling as fs

        probs = fs.softmax(torch.randn(4, 1000, device=dev), temperature=torch.ones(4, device=dev))
        fs.top_k_top_p_sampling_from_probs(probs, torch.full((4,), 10, device=dev, dtype=torch.int32),
                                           torch.full((4,), 0.9, device=dev))  # fmt: skip
        probs = fs.top_k_renorm_probs(probs, torch.full((4,), 10, device=dev, dtype=torch.int32))
        probs = fs.top_p_renorm_probs(probs, torch.full((4,), 0.9, device=dev))
        fs.min_p_sampling_from_probs(probs, torch.full((4,), 0.1, device=dev))
    torch.cuda.synchronize()
    print(f"flashinfer {family} ready in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
