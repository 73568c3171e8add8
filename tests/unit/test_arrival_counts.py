"""The arrival counts the one-launch kernels count in (`kernels/arrivals.py`): zeros of the size asked for,
grown when a larger batch needs more, and a buffer it outgrows kept alive for the graphs that still use it."""

from __future__ import annotations

import torch

from tokenspeed.runtime.kernels.arrivals import ArrivalCounts


def test_counts_grow_and_keep_what_they_outgrew():
    counts = ArrivalCounts("a test kernel")
    small = counts.at_least(8, torch.device("cpu"))
    assert small.dtype == torch.int32 and small.numel() == 8 and counts.all_zero()
    assert counts.at_least(4, torch.device("cpu")) is small  # enough already: the same buffer
    big = counts.at_least(32, torch.device("cpu"))
    assert big is not small and big.numel() == 32
    small[3] = 1  # a launch captured against the old buffer that did not leave it at zero
    assert not counts.all_zero()  # the outgrown buffer is still watched, and still alive
