"""Page allocator of the paged KV cache.

Pages are `block_size` consecutive token slots of the KV pool. Page 0 is never handed out: it is the
padding target of `kv_pool.py` (CUDA-graph padding and dummy writes land there), so a pool of N pages
has N - 1 allocatable pages.
"""

from __future__ import annotations


class PageAllocator:
    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"the KV pool needs at least 2 pages (page 0 is reserved), got {num_pages}")
        self.num_pages = num_pages
        # A stack: the most recently freed page is reused first, which keeps the working set warm.
        self._free: list[int] = list(range(num_pages - 1, 0, -1))

    @property
    def num_allocatable(self) -> int:
        """Pages a request can ever get: all but the reserved page 0."""
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_allocatable - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"out of KV pages: asked for {n}, {len(self._free)} free")
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        return pages

    def free(self, pages: list[int]) -> None:
        self._free.extend(pages)

    def free_pages(self) -> list[int]:
        """A copy of the free list (for checks and debugging)."""
        return list(self._free)

    def reset(self) -> None:
        self._free = list(range(self.num_pages - 1, 0, -1))
