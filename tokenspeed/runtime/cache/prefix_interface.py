"""The prefix cache interface and its result tuple, below both implementations (prefix_cache.py's null
cache and factory, radix_cache.py's tree).

Ownership of KV pages: a page belongs either to the allocator's free list, to one request (its private
pages), or to the prefix cache (tree pages, shared read-only by every request that matched them). A
request that holds tree pages holds a lock on the deepest node they come from; locked pages are never
evicted. The scheduler never asks whether caching is enabled: the null cache simply never matches and
never keeps anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenspeed.runtime.cache.allocator import PageAllocator


@dataclass(frozen=True)
class MatchResult:
    pages: list[int] = field(default_factory=list)  # cached pages covering the prefix, in order
    node: Any = None  # lock handle of the deepest matched node; None when nothing matched

    @property
    def num_pages(self) -> int:
        return len(self.pages)


class PrefixCache(ABC):
    def __init__(self, allocator: PageAllocator, block_size: int):
        self.allocator = allocator
        self.block_size = block_size

    @abstractmethod
    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        """Longest cached prefix of `tokens` in whole pages (touches it for LRU; does not lock it)."""

    @abstractmethod
    def cache_unfinished(self, tokens: Sequence[int], pages: list[int], node: Any) -> tuple[list[int], Any]:
        """Share a running request's full computed pages (`tokens` covers exactly `pages`).

        Returns the pages the request must use from now on for that prefix (the cache's copies where it
        already had them; the request's duplicates are freed) and the node the request now holds locked
        instead of `node`.
        """

    @abstractmethod
    def cache_finished(self, tokens: Sequence[int], pages: list[int], node: Any) -> None:
        """A request is done with its pages: keep its full computed pages, free the rest, drop its lock.

        `tokens` are the tokens whose K/V is computed; `pages` every page the request holds.
        """

    def lock(self, node: Any) -> None:  # noqa: B027 - no-op for caches without nodes
        pass

    def unlock(self, node: Any) -> None:  # noqa: B027
        pass

    def evict(self, num_pages: int) -> int:
        """Free up to `num_pages` unlocked cached pages, least recently used first; returns how many."""
        return 0

    @property
    def evictable_pages(self) -> int:
        return 0

    @property
    def protected_pages(self) -> int:
        """Cached pages locked by running requests."""
        return 0

    def reset(self) -> None:  # noqa: B027
        """Drop every cached page (only when no request holds a lock)."""
