"""Radix prefix cache at page granularity.

Every edge holds whole pages: a node's `key` is `len(pages) * block_size` tokens and `pages[j]` holds
the K/V of `key[j * bs:(j + 1) * bs]`. Children are keyed by their first page of tokens, so siblings
never share a first page and a lookup is one dict probe per edge. Edges split only at page boundaries.

    root ── [a b | c d] ── [e f]          (block_size 2; "|" separates pages)
                        └─ [g h | i j]

`lock_ref` counts running requests below a node (a lock on a node locks its whole path up to the root);
only leaves with lock_ref == 0 are evicted, least recently used first, and a parent whose last child
went becomes a leaf in turn.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

from tokenspeed.runtime.cache.allocator import PageAllocator
from tokenspeed.runtime.cache.prefix_interface import MatchResult, PrefixCache


class TreeNode:
    __slots__ = ("key", "pages", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key: tuple[int, ...], pages: list[int], parent: TreeNode | None):
        self.key = key
        self.pages = pages
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0

    def is_leaf(self) -> bool:
        return not self.children


class RadixCache(PrefixCache):
    def __init__(self, allocator: PageAllocator, block_size: int):
        super().__init__(allocator, block_size)
        self._clock = itertools.count(1)
        self._evictable = 0
        self._protected = 0
        self.root = TreeNode((), [], None)
        self.root.lock_ref = 1  # the root is never evicted

    # ---- lookups ------------------------------------------------------------------------------
    def _page_key(self, tokens: Sequence[int], page: int) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(tokens[page * bs : (page + 1) * bs])

    def _common_pages(self, node: TreeNode, tokens: Sequence[int], start_page: int, max_pages: int) -> int:
        """How many of node's pages equal the tokens' pages from `start_page` on (at most max_pages)."""
        bs = self.block_size
        n = min(len(node.pages), max_pages)
        off = start_page * bs
        for j in range(1, n):  # page 0 matched through the children dict
            if node.key[j * bs : (j + 1) * bs] != tuple(tokens[off + j * bs : off + (j + 1) * bs]):
                return j
        return n

    def _split(self, node: TreeNode, n_pages: int) -> TreeNode:
        """Cut `node` after its first n_pages pages; returns the new upper node."""
        bs = self.block_size
        upper = TreeNode(node.key[: n_pages * bs], node.pages[:n_pages], node.parent)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        assert node.parent is not None
        node.parent.children[node.key[:bs]] = upper
        node.key = node.key[n_pages * bs :]
        node.pages = node.pages[n_pages:]
        node.parent = upper
        upper.children[node.key[:bs]] = node
        return upper

    def _walk(self, tokens: Sequence[int], num_pages: int) -> tuple[TreeNode, list[int]]:
        """Deepest node covering a prefix of tokens' first num_pages pages, and the pages on the path."""
        node, pages, i = self.root, [], 0
        now = next(self._clock)
        node.last_access = now
        while i < num_pages:
            child = node.children.get(self._page_key(tokens, i))
            if child is None:
                break
            m = self._common_pages(child, tokens, i, num_pages - i)
            if m < len(child.pages):
                child = self._split(child, m)
            child.last_access = now
            pages.extend(child.pages)
            node, i = child, i + m
        return node, pages

    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        node, pages = self._walk(tokens, len(tokens) // self.block_size)
        return MatchResult(pages=pages, node=None if node is self.root else node)

    # ---- inserts ------------------------------------------------------------------------------
    def _insert(self, tokens: Sequence[int], pages: list[int]) -> tuple[TreeNode, list[int], list[int]]:
        """Insert `pages` for `tokens`; returns (deepest node, the tree's pages, the caller's duplicates)."""
        bs = self.block_size
        n = min(len(pages), len(tokens) // bs)
        node, tree_pages = self._walk(tokens, n)
        k = len(tree_pages)
        duplicates = [p for p, t in zip(pages[:k], tree_pages, strict=True) if p != t]
        if k < n:
            leaf = TreeNode(tuple(tokens[k * bs : n * bs]), list(pages[k:n]), node)
            leaf.last_access = node.last_access
            node.children[leaf.key[:bs]] = leaf
            self._evictable += len(leaf.pages)
            tree_pages = tree_pages + leaf.pages
            node = leaf
        return node, tree_pages, duplicates

    def cache_unfinished(self, tokens: Sequence[int], pages: list[int], node: Any) -> tuple[list[int], Any]:
        new_node, tree_pages, duplicates = self._insert(tokens, pages)
        self.allocator.free(duplicates)
        self.lock(new_node)
        self.unlock(node)
        return tree_pages, None if new_node is self.root else new_node

    def cache_finished(self, tokens: Sequence[int], pages: list[int], node: Any) -> None:
        n = min(len(pages), len(tokens) // self.block_size)
        _, _, duplicates = self._insert(tokens, pages[:n])
        self.allocator.free(duplicates + pages[n:])
        self.unlock(node)

    # ---- locks and eviction -------------------------------------------------------------------
    def lock(self, node: Any) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.pages)
                self._protected += len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Any) -> None:
        while node is not None and node is not self.root:
            assert node.lock_ref > 0, "unlocking a node that is not locked"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.pages)
                self._protected -= len(node.pages)
            node = node.parent

    def _evictable_leaves(self) -> list[tuple[int, int, TreeNode]]:
        heap, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.is_leaf() and node.lock_ref == 0:
                heap.append((node.last_access, id(node), node))
            stack.extend(node.children.values())
        heapq.heapify(heap)
        return heap

    def evict(self, num_pages: int) -> int:
        if num_pages <= 0 or self._evictable == 0:
            return 0
        heap, freed = self._evictable_leaves(), 0
        while freed < num_pages and heap:
            _, _, node = heapq.heappop(heap)
            excess = len(node.pages) - (num_pages - freed)
            if excess > 0:
                # Keep the head of a long edge: only its tail pages are needed back.
                self._split(node, excess)
            self.allocator.free(node.pages)
            freed += len(node.pages)
            self._evictable -= len(node.pages)
            parent = node.parent
            del parent.children[node.key[: self.block_size]]
            if parent is not self.root and parent.is_leaf() and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    @property
    def evictable_pages(self) -> int:
        return self._evictable

    @property
    def protected_pages(self) -> int:
        return self._protected

    def reset(self) -> None:
        if self._protected:
            raise RuntimeError("cannot reset the prefix cache while requests hold cached pages")
        self.evict(self._evictable)
        self.root = TreeNode((), [], None)
        self.root.lock_ref = 1
