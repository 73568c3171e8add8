"""The null cache used with --no-enable-prefix-caching, and the factory that picks the cache
(the interface is in prefix_interface.py, the radix tree in radix_cache.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenspeed.runtime.cache.allocator import PageAllocator
from tokenspeed.runtime.cache.prefix_interface import MatchResult, PrefixCache
from tokenspeed.runtime.cache.radix_cache import RadixCache


class NullPrefixCache(PrefixCache):
    """Never matches, never keeps a page."""

    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        return MatchResult()

    def cache_unfinished(self, tokens: Sequence[int], pages: list[int], node: Any) -> tuple[list[int], Any]:
        return pages, None

    def cache_finished(self, tokens: Sequence[int], pages: list[int], node: Any) -> None:
        self.allocator.free(pages)


def create_prefix_cache(enabled: bool, allocator: PageAllocator, block_size: int) -> PrefixCache:
    if enabled:
        return RadixCache(allocator, block_size)
    return NullPrefixCache(allocator, block_size)
