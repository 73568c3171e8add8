"""Shared set-up of the engine tests."""

from __future__ import annotations

import pytest
import torch

# The tiny test models run thousands of small ops. With several CPU threads, each op pays for waking and
# syncing an OpenMP team, and on a busy 2-core CI runner that costs 10-20x the op itself; one thread is
# as fast as two when idle and keeps the suite fast when other processes compete for the cores.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests, restoring the count after them (a module may change it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
