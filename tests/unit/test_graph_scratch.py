"""Scratch that CUDA graphs keep pointing at (`kernels/graph_scratch.py`): the size asked for, grown when a
larger batch needs more (to the size `grow_to` names, so one growth serves every captured batch), and a
buffer it outgrows kept alive for the graphs that still use it; arrival counts are zeros."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tokenspeed.runtime.kernels.decode_attention import decode_num_splits
from tokenspeed.runtime.kernels.graph_scratch import ArrivalCounts, GraphScratch
from tokenspeed.runtime.layers.attention.triton_backend import TritonAttentionBackend

CPU = torch.device("cpu")


def test_counts_grow_and_keep_what_they_outgrew():
    counts = ArrivalCounts("a test kernel")
    small = counts.at_least(8, CPU)
    assert small.dtype == torch.int32 and small.numel() == 8 and counts.all_zero()
    assert counts.at_least(4, CPU) is small  # enough already: the same buffer
    big = counts.at_least(32, CPU)
    assert big is not small and big.numel() == 32
    small[3] = 1  # a launch captured against the old buffer that did not leave it at zero
    assert not counts.all_zero()  # the outgrown buffer is still watched, and still alive


def test_scratch_grows_once_to_what_the_graphs_need():
    asked = []
    scratch = GraphScratch("a test buffer", torch.float32)

    def need() -> int:
        asked.append(1)
        return 100

    first = scratch.at_least(10, CPU, need)
    assert first.dtype == torch.float32 and first.numel() == 100 and len(asked) == 1
    assert scratch.at_least(100, CPU, need) is first and len(asked) == 1  # no growth: `need` not asked
    bigger = scratch.at_least(150, CPU, need)  # an eager batch past every captured one
    assert bigger.numel() == 150 and len(asked) == 2
    assert any(b is first for b in scratch._outgrown)  # still alive for the graphs that point at it


def test_attention_split_scratch_fits_every_captured_batch():
    # the Triton backend's views into its scratch, on the CPU: sized at the first eager run for the worst
    # batch up to the largest captured one, so every captured size's views lie inside that one allocation
    backend = SimpleNamespace(
        _mid_o=GraphScratch("o", torch.float32), _mid_lse=GraphScratch("lse", torch.float32),
        arrivals=ArrivalCounts("attention"), _graph_max_bs=48, num_sms=132,
    )  # fmt: skip
    heads, kv_heads, head_dim = 32, 8, 128
    bs = 1
    mid_o, mid_lse, arrivals = TritonAttentionBackend._scratch(
        backend, bs, decode_num_splits(bs, kv_heads, 132), heads, head_dim, kv_heads, CPU
    )
    o_buf, lse_buf = backend._mid_o._buf, backend._mid_lse._buf
    assert mid_o.shape == (1, heads, decode_num_splits(1, kv_heads, 132), head_dim)
    assert arrivals.numel() >= 48 * kv_heads and arrivals.dtype == torch.int32
    for b in range(1, 49):
        splits = decode_num_splits(b, kv_heads, 132)
        o, lse, _ = TritonAttentionBackend._scratch(backend, b, splits, heads, head_dim, kv_heads, CPU)
        assert o.shape == (b, heads, splits, head_dim) and lse.shape == (b, heads, splits)
        assert o.data_ptr() == o_buf.data_ptr() and lse.data_ptr() == lse_buf.data_ptr()
    assert backend._mid_o._buf is o_buf and not backend._mid_o._outgrown  # no growth after the first
