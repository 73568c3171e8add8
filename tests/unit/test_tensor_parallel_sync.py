"""In-process pieces of the multi-rank engine: the batch decision peers follow, EPLB transfer plans, groups."""

from __future__ import annotations

import msgpack
import pytest
import torch

from tokenspeed.runtime.cache.req_to_token import ReqToTokenTable
from tokenspeed.runtime.distributed.batch_sync import PageMirror, decode_batch, encode_batch
from tokenspeed.runtime.distributed.groups import ParallelGroups
from tokenspeed.runtime.distributed.mapping import Mapping
from tokenspeed.runtime.moe.eplb_manager import logical_counts, plan_transfers
from tokenspeed.runtime.scheduler.batch import ScheduledBatch, ScheduledRequest
from tokenspeed.runtime.scheduler.request import Request
from tokenspeed.sampling_params import SamplingParams

BS = 4


def _req(rid: str, tokens: list[int], row: int, pages: list[int]) -> Request:
    r = Request(rid=rid, prompt_ids=tokens, sampling=SamplingParams())
    r.row, r.pages = row, pages
    return r


def test_peer_table_follows_rank0_through_reuse_and_page_changes():
    leader = ReqToTokenTable(4, 32, BS, "cpu")
    peer = ReqToTokenTable(4, 32, BS, "cpu")
    mirror = PageMirror(BS)

    def step(items):
        batch = ScheduledBatch(items=items)
        for it in items:
            leader.write_pages(it.req.row, 0, it.req.pages)
        wire = msgpack.unpackb(msgpack.packb(encode_batch(batch, mirror)))  # what travels
        got = decode_batch(wire, peer)
        for it, mine in zip(items, got.items, strict=True):
            end = it.start + it.num_new_tokens
            assert mine.req.token_ids[it.start : end] == it.req.token_ids[it.start : end]
            assert (mine.start, mine.num_new_tokens, mine.sample) == (it.start, it.num_new_tokens, it.sample)
            assert torch.equal(peer.table[it.req.row, :end], leader.table[it.req.row, :end])
        return wire

    a = _req("a", list(range(10)), row=0, pages=[3, 4, 5])
    b = _req("b", [7, 8], row=1, pages=[9])
    step([ScheduledRequest(a, 0, 10), ScheduledRequest(b, 0, 2)])
    a.token_ids.append(42)
    wire = step([ScheduledRequest(a, 10, 1)])
    assert wire["items"][0][5] == []  # a decode inside known pages sends no page
    a.pages[:2] = [11, 12]  # the prefix cache swapped in shared pages
    a.token_ids.append(43)
    a.pages.append(6)
    wire = step([ScheduledRequest(a, 11, 1)])
    assert wire["items"][0][4:6] == [0, [11, 12, 5]]
    c = _req("c", list(range(50, 56)), row=1, pages=[9, 2])  # row 1 reused by another request
    wire = step([ScheduledRequest(c, 0, 6)])
    assert wire["items"][0][4:6] == [1, [2]]


def test_transfer_plan_prefers_local_copies_and_covers_every_changed_slot():
    old = torch.tensor([[0, 1, 2, 3, 4, 5]])  # 2 ranks x 3 slots
    new = torch.tensor([[0, 0, 2, 3, 5, 1]])
    moves = plan_transfers(old, new, 3, [0])
    assert [(m.dst_rank, m.dst_local, m.src_rank, m.src_local) for m in moves] == [
        (0, 1, 0, 0),  # expert 0 copied inside rank 0
        (1, 1, 1, 2),  # expert 5 from rank 1's own slot
        (1, 2, 0, 1),  # expert 1 from rank 0
    ]
    counts = logical_counts(torch.tensor([[5, 5, 1, 1, 1, 1]]), new, 6)
    assert counts.tolist() == [[10.0, 1.0, 1.0, 1.0, 0.0, 1.0]]


def test_groups_of_a_dp_only_server_need_no_communicator():
    mapping = Mapping(world_size=2, attn_tp_size=1, attn_dp_size=2)
    assert mapping.dense_tp_size == 2  # the default dense TP of a DP server spans its DP ranks...
    groups = ParallelGroups.local_only(mapping, rank=1)
    # ...but attention DP replicas hold different requests: every part runs on the rank alone
    assert groups.dense_tp.size == 1 and groups.moe_ep.size == 1 and groups.attn_tp.ranks == (1,)
    with pytest.raises(ValueError, match="group kind"):
        groups.get("pp")
