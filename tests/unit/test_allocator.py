"""Page allocator and req_to_token table."""

import pytest
import torch

from tokenspeed.runtime.cache.allocator import PageAllocator
from tokenspeed.runtime.cache.req_to_token import ReqToTokenTable


def test_page_zero_is_never_handed_out():
    alloc = PageAllocator(8)
    assert alloc.num_allocatable == 7
    pages = alloc.allocate(7)
    assert sorted(pages) == list(range(1, 8))
    assert alloc.num_free == 0 and not alloc.can_allocate(1)


def test_allocate_free_round_trip_and_errors():
    alloc = PageAllocator(5)
    a = alloc.allocate(2)
    b = alloc.allocate(2)
    assert not set(a) & set(b)
    assert alloc.num_used == 4 and alloc.can_allocate(0) and not alloc.can_allocate(1)
    with pytest.raises(RuntimeError, match="out of KV pages"):
        alloc.allocate(1)
    alloc.free(a)
    assert alloc.num_free == 2 and alloc.can_allocate(2)
    c = alloc.allocate(2)
    assert set(c) == set(a)  # freed pages are reused
    alloc.free(b + c)
    assert alloc.num_free == alloc.num_allocatable
    assert alloc.allocate(0) == []


def test_pool_needs_two_pages():
    with pytest.raises(ValueError, match="at least 2 pages"):
        PageAllocator(1)


def test_req_to_token_rows_follow_pages():
    table = ReqToTokenTable(num_rows=2, max_context_len=10, block_size=4, device="cpu")
    assert table.width == 12  # rounded up to whole pages
    row = table.allocate()
    table.write_pages(row, 0, [3, 1])
    table.write_pages(row, 2, [5])
    expected = [12, 13, 14, 15, 4, 5, 6, 7, 20, 21, 22, 23]
    assert table.table[row].tolist() == expected
    assert table.table.dtype == torch.int32
    other = table.allocate()
    assert other != row and not table.can_allocate()
    with pytest.raises(RuntimeError):
        table.allocate()
    table.free(row)
    table.free(other)
    assert table.num_free_rows == 2
