"""Who holds which KV page: the allocator, the req_to_token table and the prefix cache, behind one API.

The scheduler calls `admit` (match the cached prefix, take a table row), `grow` (pages for the tokens a
step computes, evicting cached pages when the free list is short), `share` (after a step, hand newly
filled pages to the prefix cache so later requests can hit them) and `release` (finish, abort or
preemption). Page accounting is in `stats`:

    allocatable pages = free + used by requests + cached (locked by running requests, or evictable)
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenspeed.runtime.cache.allocator import PageAllocator
from tokenspeed.runtime.cache.prefix_interface import PrefixCache
from tokenspeed.runtime.cache.req_to_token import ReqToTokenTable
from tokenspeed.runtime.scheduler.request import Request


@dataclass(frozen=True)
class KVCacheStats:
    pages_total: int
    pages_free: int
    pages_evictable: int  # cached, not locked: reclaimable at any time

    @property
    def pages_used(self) -> int:
        return self.pages_total - self.pages_free - self.pages_evictable


class KVCacheManager:
    def __init__(self, allocator: PageAllocator, table: ReqToTokenTable, prefix_cache: PrefixCache):
        self.allocator = allocator
        self.table = table
        self.prefix_cache = prefix_cache
        self.block_size = table.block_size
        self.hit_tokens = 0  # cumulative, in tokens
        self.query_tokens = 0

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_pages(self, n: int) -> list[int] | None:
        short = n - self.allocator.num_free
        if short > 0:
            self.prefix_cache.evict(short)
            if not self.allocator.can_allocate(n):
                return None
        return self.allocator.allocate(n)

    def admit(self, req: Request) -> bool:
        """Give a waiting request a table row and its cached prefix. False when no row is free."""
        if not self.table.can_allocate():
            return False
        match = self.prefix_cache.match_prefix(req.token_ids[: req.prefix_match_limit()])
        self.prefix_cache.lock(match.node)
        req.row = self.table.allocate()
        req.pages = list(match.pages)
        req.num_tree_pages = match.num_pages
        req.cache_node = match.node
        req.num_computed_tokens = match.num_pages * self.block_size
        self.table.write_pages(req.row, 0, req.pages)
        return True

    def record_admission(self, req: Request) -> None:
        """Count the request's lookup once it is scheduled (a failed admission is retried, not counted)."""
        self.query_tokens += req.num_tokens
        self.hit_tokens += req.num_computed_tokens
        if req.num_preemptions == 0:
            req.num_cached_tokens = req.num_computed_tokens

    def grow(self, req: Request, num_new_tokens: int) -> bool:
        """Make sure pages cover the request's tokens up to num_computed + num_new_tokens."""
        need = self.pages_for(req.num_computed_tokens + num_new_tokens) - len(req.pages)
        if need <= 0:
            return True
        pages = self._take_pages(need)
        if pages is None:
            return False
        self.table.write_pages(req.row, len(req.pages), pages)
        req.pages.extend(pages)
        return True

    def truncate(self, req: Request) -> None:
        """Free the pages past the request's computed tokens (a verify step's rejected drafts); pages the
        prefix cache holds are never among them."""
        keep = max(self.pages_for(req.num_computed_tokens), req.num_tree_pages)
        extra = req.pages[keep:]
        if extra:
            del req.pages[keep:]
            self.allocator.free(extra)

    def share(self, req: Request) -> None:
        """Offer the request's newly filled pages to the prefix cache."""
        full = req.num_computed_tokens // self.block_size
        if full <= req.num_tree_pages:
            return
        tokens = req.token_ids[: full * self.block_size]
        tree_pages, req.cache_node = self.prefix_cache.cache_unfinished(
            tokens, req.pages[:full], req.cache_node
        )
        if tree_pages != req.pages[:full]:
            req.pages[:full] = tree_pages
            self.table.write_pages(req.row, 0, tree_pages)
        req.num_tree_pages = full

    def release(self, req: Request) -> None:
        """Return every page and the row of a request that stops running (finished or preempted)."""
        if req.row is None:
            return
        self.prefix_cache.cache_finished(req.token_ids[: req.num_computed_tokens], req.pages, req.cache_node)
        self.table.free(req.row)
        req.row, req.pages, req.num_tree_pages, req.cache_node = None, [], 0, None

    def stats(self) -> KVCacheStats:
        return KVCacheStats(
            pages_total=self.allocator.num_allocatable,
            pages_free=self.allocator.num_free,
            pages_evictable=self.prefix_cache.evictable_pages,
        )

    def flush(self) -> None:
        self.prefix_cache.reset()
