"""The Triton decode attention's split count and launch configuration, as measured on the H200
(benchmarks/results/gpu_decode_attention.json): at most four programs a multiprocessor, at most 16 splits,
three stages (two over an FP8 cache, for its registers), 128 keys a step once the grid has six programs a
multiprocessor."""

from __future__ import annotations

import pytest

from tokenspeed.runtime.kernels.decode_attention import (
    MAX_SPLITS,
    DecodeLaunch,
    decode_launch,
    decode_num_splits,
)

H200_SMS = 132


@pytest.mark.parametrize(
    ("kv_heads", "expected"),
    [(4, {1: 16, 16: 8, 64: 2, 256: 1}), (8, {1: 16, 16: 4, 64: 1, 256: 1})],
    ids=["qwen3-30b-a3b", "llama-3.1-8b"],
)
def test_split_counts_are_the_measured_winners(kv_heads, expected):
    assert {bs: decode_num_splits(bs, kv_heads, H200_SMS) for bs in expected} == expected


def test_splits_are_powers_of_two_that_never_overfill_the_gpu():
    for kv_heads in (1, 2, 4, 8, 16):
        last = MAX_SPLITS
        for bs in range(1, 513):
            splits = decode_num_splits(bs, kv_heads, H200_SMS)
            assert 1 <= splits <= MAX_SPLITS and splits & (splits - 1) == 0
            assert splits == 1 or bs * kv_heads * splits <= 4 * H200_SMS
            assert splits <= last  # a larger batch never gets more splits (each captured graph keeps its own)
            last = splits


def test_launch_configuration():
    assert decode_launch(128, False, 512, H200_SMS) == DecodeLaunch(block_n=64, num_warps=4, num_stages=3)
    assert decode_launch(128, False, 1024, H200_SMS) == DecodeLaunch(block_n=128, num_warps=4, num_stages=3)
    # float32 (the CPU interpreter's tests) and wide heads keep the small tile and two stages
    assert decode_launch(128, True, 1024, H200_SMS) == DecodeLaunch(block_n=32, num_stages=2)
    assert decode_launch(256, False, 64, H200_SMS) == DecodeLaunch(block_n=32, num_stages=2)


def test_an_fp8_cache_keeps_two_stages_where_four_programs_a_multiprocessor_must_fit():
    # 64 requests on the 8B shape: 512 programs, four a multiprocessor (the split rule's target)
    assert decode_num_splits(64, 8, H200_SMS) == 1
    assert decode_launch(128, False, 512, H200_SMS, kv_bytes=1) == DecodeLaunch(block_n=64, num_stages=2)
    assert decode_launch(128, False, 512, H200_SMS, kv_bytes=2) == DecodeLaunch(block_n=64, num_stages=3)
    # many waves anyway: the long-range tile, as for bf16
    assert decode_launch(128, False, 1024, H200_SMS, kv_bytes=1) == DecodeLaunch(block_n=128, num_stages=3)
