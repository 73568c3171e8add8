"""Radix prefix cache at page granularity: matching, splitting, sharing, locks, LRU eviction, accounting."""

import random

import pytest

from tokenspeed.runtime.cache.allocator import PageAllocator
from tokenspeed.runtime.cache.prefix_cache import NullPrefixCache, create_prefix_cache
from tokenspeed.runtime.cache.radix_cache import RadixCache

BS = 2


def make(num_pages=32):
    alloc = PageAllocator(num_pages)
    return alloc, RadixCache(alloc, BS)


def store(alloc, cache, tokens):
    """A finished request that computed `tokens` into fresh pages hands them to the cache."""
    pages = alloc.allocate(-(-len(tokens) // BS))
    cache.cache_finished(tokens, pages, None)
    return pages


def accounted(alloc, cache):
    return alloc.num_free + cache.evictable_pages + cache.protected_pages


def test_match_is_page_granular_and_splits_edges():
    alloc, cache = make()
    pages = store(alloc, cache, [1, 2, 3, 4, 5, 6, 7])  # 3 full pages kept, the partial one freed
    assert cache.evictable_pages == 3
    assert accounted(alloc, cache) == alloc.num_allocatable
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    assert m.pages == pages[:3]
    m = cache.match_prefix([1, 2, 3, 9])  # mismatch inside page 1: only page 0 matches
    assert m.pages == pages[:1]
    # the edge was split at the page boundary; both halves still match
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).pages == pages[:3]
    assert cache.match_prefix([1]).pages == []  # less than a page never matches
    assert cache.match_prefix([9, 9, 9, 9]).node is None


def test_insert_deduplicates_against_the_tree():
    alloc, cache = make()
    first = store(alloc, cache, [1, 2, 3, 4])
    free_before = alloc.num_free
    # Another request computed the same prefix into its own pages, then more.
    mine = alloc.allocate(3)
    tree_pages, node = cache.cache_unfinished([1, 2, 3, 4, 5, 6], mine, None)
    assert tree_pages == first + [mine[2]]
    assert alloc.num_free == free_before - 1  # its two duplicate pages went back
    assert cache.protected_pages == 3 and cache.evictable_pages == 0
    cache.unlock(node)
    assert cache.protected_pages == 0 and cache.evictable_pages == 3
    assert accounted(alloc, cache) == alloc.num_allocatable


def test_locked_pages_are_not_evicted_and_lru_goes_first():
    alloc, cache = make()
    a = store(alloc, cache, [1, 1, 2, 2])
    b = store(alloc, cache, [3, 3, 4, 4])
    c = store(alloc, cache, [5, 5, 6, 6])
    cache.match_prefix([1, 1, 2, 2])  # touch a: b is now the least recently used
    m = cache.match_prefix([5, 5, 6, 6])
    cache.lock(m.node)  # c is in use
    assert cache.evict(2) == 2
    assert cache.match_prefix([3, 3, 4, 4]).pages == []
    assert cache.match_prefix([1, 1, 2, 2]).pages == a
    assert cache.evict(100) == 2  # a goes; c is locked
    assert cache.match_prefix([5, 5, 6, 6]).pages == c
    assert cache.evictable_pages == 0 and cache.protected_pages == 2
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.unlock(m.node)
    cache.reset()
    assert alloc.num_free == alloc.num_allocatable
    assert set(b).isdisjoint(cache.match_prefix([3, 3, 4, 4]).pages)


def test_eviction_walks_up_to_parents():
    alloc, cache = make()
    store(alloc, cache, [1, 1, 2, 2, 3, 3])
    store(alloc, cache, [1, 1, 2, 2, 4, 4])  # shares two pages, adds one leaf
    assert cache.evictable_pages == 4
    assert cache.evict(4) == 4
    assert alloc.num_free == alloc.num_allocatable


def test_lock_counts_nest():
    alloc, cache = make()
    store(alloc, cache, [1, 1, 2, 2])
    m1 = cache.match_prefix([1, 1, 2, 2])
    m2 = cache.match_prefix([1, 1, 9, 9])  # splits the node under m1's lock
    cache.lock(m1.node)
    cache.lock(m2.node)
    assert cache.protected_pages == 2
    cache.unlock(m1.node)
    assert cache.protected_pages == 1 and cache.evict(10) == 1
    cache.unlock(m2.node)
    assert cache.evict(10) == 1 and alloc.num_free == alloc.num_allocatable


def test_random_workload_keeps_every_page_accounted():
    rng = random.Random(0)
    alloc, cache = make(num_pages=40)
    live = []  # (tokens, pages, node) of "running requests"
    for _ in range(400):
        op = rng.random()
        if op < 0.5:
            tokens = [rng.randint(0, 3) for _ in range(rng.randint(1, 14))]
            m = cache.match_prefix(tokens)
            cache.lock(m.node)
            assert len(m.pages) <= len(tokens) // BS
            extra = -(-len(tokens) // BS) - len(m.pages)
            if not alloc.can_allocate(extra):
                cache.evict(extra - alloc.num_free)
            if not alloc.can_allocate(extra):
                cache.unlock(m.node)
                continue
            pages = m.pages + alloc.allocate(extra)
            if rng.random() < 0.5:
                full = len(tokens) // BS
                tree, node = cache.cache_unfinished(tokens[: full * BS], pages[:full], m.node)
                pages[:full] = tree
                live.append((tokens, pages, node))
            else:
                live.append((tokens, pages, m.node))
        elif live:
            tokens, pages, node = live.pop(rng.randrange(len(live)))
            cache.cache_finished(tokens, pages, node)
        tree = [p for n in _nodes(cache) for p in n.pages]
        private = [p for _, pages, _ in live for p in pages if p not in set(tree)]
        assert len(set(private)) == len(private), "a private page is held by two requests"
        assert len(set(tree)) == len(tree), "a page is twice in the tree"
        assert alloc.num_free + len(tree) + len(private) == alloc.num_allocatable
        assert len(tree) == cache.evictable_pages + cache.protected_pages
    for tokens, pages, node in live:
        cache.cache_finished(tokens, pages, node)
    assert cache.protected_pages == 0
    cache.reset()
    assert alloc.num_free == alloc.num_allocatable


def _nodes(cache):
    stack, out = list(cache.root.children.values()), []
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


def test_null_cache_keeps_nothing():
    alloc = PageAllocator(8)
    cache = create_prefix_cache(False, alloc, BS)
    assert isinstance(cache, NullPrefixCache)
    pages = alloc.allocate(3)
    same, node = cache.cache_unfinished([1, 2, 3, 4], pages[:2], None)
    assert same == pages[:2] and node is None
    cache.cache_finished([1, 2, 3, 4, 5], pages, None)
    assert alloc.num_free == alloc.num_allocatable
    assert cache.match_prefix([1, 2, 3, 4]).pages == []
    assert cache.evict(5) == 0 and cache.evictable_pages == 0


def test_eviction_takes_only_the_tail_of_a_long_edge():
    alloc, cache = make()
    pages = store(alloc, cache, [1, 1, 2, 2, 3, 3, 4, 4])
    assert cache.evict(1) == 1
    assert cache.match_prefix([1, 1, 2, 2, 3, 3, 4, 4]).pages == pages[:3]
    assert cache.evictable_pages == 3 and accounted(alloc, cache) == alloc.num_allocatable
