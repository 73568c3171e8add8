"""The batch decision rank 0 of a TP group sends its peers, and the peers' side of it.

Peers run no scheduler: each step they receive what to compute and run the same forward (their share of
every collective), then discard the logits; only rank 0 samples. A decision is plain msgpack data:

    {"ops": [[name, args], ...],            control operations to apply first (recorder, rebalance)
     "batch": {"decode": bool,
               "items": [[row, start, num_new, token_ids, first_page, pages, sample], ...]},
     "stop": bool}

Peers keep their own copy of the `req_to_token` table. Rank 0 remembers the page list it last sent
for each table row (`PageMirror`) and sends only the pages from the first one that differs, so a decode
step usually carries no page at all, while rows reused by another request, pages shared with the prefix
cache or a preempted request are resent from where they changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class PageMirror:
    """Rank 0's view of the peers' `req_to_token` rows, as page lists."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.rows: dict[int, list[int]] = {}

    def diff(self, row: int, pages: list[int]) -> tuple[int, list[int]]:
        """(first changed page index, pages from there) that bring the peers' row up to `pages`."""
        prev = self.rows.get(row, [])
        first = 0
        limit = min(len(prev), len(pages))
        while first < limit and prev[first] == pages[first]:
            first += 1
        new = list(pages[first:])
        self.rows[row] = list(pages) + prev[len(pages) :]
        return first, new


def encode_batch(batch: Any, mirror: PageMirror) -> dict[str, Any]:
    """The msgpack-able decision for a `ScheduledBatch` of rank 0's scheduler."""
    items = []
    for it in batch.items:
        req = it.req
        end = it.start + it.num_new_tokens
        pages = req.pages[: math.ceil(end / mirror.block_size)]
        first, new_pages = mirror.diff(req.row, pages)
        items.append(
            [req.row, it.start, it.num_new_tokens, list(req.token_ids[it.start : end]), first, new_pages,
             bool(it.sample)]
        )  # fmt: skip
    return {"decode": bool(batch.is_decode_only), "items": items}


class _Window:
    """The new tokens of one item, indexable the way `ModelRunner.prepare` slices `req.token_ids`."""

    def __init__(self, start: int, tokens: list[int]):
        self.start = start
        self.tokens = tokens

    def __getitem__(self, key: slice) -> list[int]:
        if not isinstance(key, slice) or key.start != self.start:
            raise IndexError("a peer only knows the tokens of the current step")
        return self.tokens[: key.stop - key.start]


@dataclass
class PeerRequest:
    row: int
    token_ids: _Window


@dataclass
class PeerItem:
    req: PeerRequest
    start: int
    num_new_tokens: int
    sample: bool
    # The runner's batch item contract; a server with TP/EP peers runs no speculative drafts (refused at start).
    draft_ids: tuple[int, ...] = ()

    @property
    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 and self.sample


@dataclass
class PeerBatch:
    items: list[PeerItem] = field(default_factory=list)
    is_decode_only: bool = False

    @property
    def has_drafts(self) -> bool:
        return False  # see PeerItem.draft_ids


def decode_batch(data: dict[str, Any], table: Any) -> PeerBatch:
    """Apply the page updates to the peer's `ReqToTokenTable` and rebuild the batch for `prepare`."""
    items = []
    for row, start, num_new, tokens, first_page, pages, sample in data["items"]:
        if pages:
            table.write_pages(row, first_page, pages)
        items.append(PeerItem(PeerRequest(row, _Window(start, tokens)), start, num_new, sample))
    return PeerBatch(items=items, is_decode_only=bool(data["decode"]))
