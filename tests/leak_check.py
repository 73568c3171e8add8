"""The shared KV page-leak assertion of the engine and server tests.

Once every request has finished or been aborted, no KV page may be held by a request: every page is
either free or cached in the prefix cache and unlocked (evictable). `assert_no_kv_leak` takes an offline
`Engine`, an `EngineCore`, or a `StatsSnapshot` (what a server reports, e.g. in /get_server_info).
With an engine it also checks the allocator directly and that flushing the cache frees every page.
"""

from __future__ import annotations

from typing import Any


def assert_stats_idle(stats: Any) -> None:
    """A scheduler's StatsSnapshot (object or dict) shows no request and no page in use."""
    get = stats.get if isinstance(stats, dict) else lambda k: getattr(stats, k)
    assert get("num_running") == 0, f"{get('num_running')} requests still running"
    assert get("num_waiting") == 0, f"{get('num_waiting')} requests still waiting"
    assert get("kv_pages_used") == 0, f"{get('kv_pages_used')} of {get('kv_pages_total')} KV pages leaked"


def assert_no_kv_leak(target: Any, flush: bool = True) -> None:
    core = getattr(target, "core", target)
    if not hasattr(core, "kv"):
        assert_stats_idle(target)
        return
    assert not core.has_unfinished(), f"unfinished requests: {list(core.scheduler.requests)}"
    kv = core.kv
    alloc, cache = kv.allocator, kv.prefix_cache
    assert cache.protected_pages == 0, f"{cache.protected_pages} cached pages still locked"
    held = alloc.num_allocatable - alloc.num_free - cache.evictable_pages
    assert held == 0, f"{held} KV pages held by no live request"
    assert kv.table.num_free_rows == kv.table.num_rows, "req_to_token rows leaked"
    assert_stats_idle(core.stats())
    if flush:
        assert core.flush_cache(), "flush_cache refused with no request in flight"
        assert alloc.num_free == alloc.num_allocatable, "pages missing after flushing the prefix cache"
        free = alloc.free_pages()
        assert len(set(free)) == len(free) and 0 not in free, "free list corrupted"
