"""The scheduler over a real KV cache manager (allocator, req_to_token table, prefix cache), no model.

Steps are driven by hand: `schedule()` decides, `update_from_output()` applies the sampled tokens.
"""

from __future__ import annotations

import time

from tokenspeed.runtime.cache.allocator import PageAllocator
from tokenspeed.runtime.cache.kv_cache_manager import KVCacheManager
from tokenspeed.runtime.cache.prefix_cache import create_prefix_cache
from tokenspeed.runtime.cache.req_to_token import ReqToTokenTable
from tokenspeed.runtime.scheduler.request import Request, RequestStatus
from tokenspeed.runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from tokenspeed.sampling_params import SamplingParams

EOS = 2


def make(
    num_pages=64, bs=4, max_num_seqs=8, chunk=None, max_prefill=8192, mixed=False, caching=True, max_len=128
):
    alloc = PageAllocator(num_pages)
    table = ReqToTokenTable(max_num_seqs, max_len, bs, "cpu")
    kv = KVCacheManager(alloc, table, create_prefix_cache(caching, alloc, bs))
    return Scheduler(SchedulerConfig(max_num_seqs, max_len, chunk, max_prefill, mixed), kv)


def req(rid, n, start=10, **sp):
    sp.setdefault("max_new_tokens", 4)
    return Request(rid, list(range(start, start + n)), SamplingParams(**sp), eos_token_ids=frozenset({EOS}))


def step(s, token=7):
    batch = s.schedule()
    s.update_from_output(batch, [token] * len(batch.items))
    return batch


def plan(batch):
    return [(it.req.rid, it.num_new_tokens) for it in batch.items]


def run_all(s, token=7, limit=500):
    for _ in range(limit):
        if not s.has_unfinished():
            return
        step(s, token)
        s.pop_outbox()
    raise AssertionError("requests did not finish")


def assert_idle(s):
    kv = s.kv
    assert not s.running and not s.waiting and not s.requests
    assert kv.prefix_cache.protected_pages == 0
    assert kv.allocator.num_free + kv.prefix_cache.evictable_pages == kv.allocator.num_allocatable
    assert kv.table.num_free_rows == kv.table.num_rows


def test_chunked_prefill_respects_the_token_budget():
    s = make(chunk=8)
    r = req("a", 20)
    s.add_request(r)
    assert plan(step(s)) == [("a", 8)]
    assert r.num_computed_tokens == 8 and r.num_output_tokens == 0
    assert plan(step(s)) == [("a", 8)]
    assert plan(step(s)) == [("a", 4)]  # last chunk: a token is sampled
    assert r.num_output_tokens == 1 and len(r.pages) == 5  # pages cover the 20 computed tokens
    assert plan(step(s)) == [("a", 1)]
    run_all(s)
    assert r.finish_reason == "length" and r.num_output_tokens == 4
    assert_idle(s)


def test_mixed_batch_shares_a_step_between_decodes_and_a_prefill():
    s = make(chunk=8, mixed=True)
    s.add_request(req("a", 3))
    step(s)
    s.add_request(req("b", 12, start=50))
    assert plan(step(s)) == [("a", 1), ("b", 7)]  # the decode takes one token of the budget


def test_without_mixed_batch_prefill_and_decode_alternate():
    s = make(chunk=8, mixed=False)
    s.add_request(req("a", 3))
    step(s)
    s.add_request(req("b", 12, start=50))
    assert plan(step(s)) == [("b", 8)]
    assert plan(step(s)) == [("b", 4)]
    assert plan(step(s)) == [("a", 1), ("b", 1)]


def test_max_num_seqs_caps_running_requests():
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(f"r{i}", 5, start=10 * i + 20))
    assert [rid for rid, _ in plan(step(s))] == ["r0", "r1"]
    assert len(s.running) == 2 and len(s.waiting) == 1
    run_all(s)
    assert_idle(s)


def test_without_chunking_prompts_are_whole_and_bounded_by_max_prefill_tokens():
    s = make(chunk=None, max_prefill=16)
    s.add_request(req("big", 30))  # larger than the budget: runs alone so it can ever run
    s.add_request(req("a", 10, start=60))
    s.add_request(req("b", 10, start=80))
    assert plan(step(s)) == [("big", 30)]
    assert plan(step(s)) == [("a", 10)]  # a + b would exceed 16
    assert plan(step(s)) == [("b", 10)]


def test_preemption_by_recompute_takes_the_newest_request():
    # 8 allocatable pages of 4 tokens; two requests of 12 prompt tokens that each want 12 more.
    s = make(num_pages=9, bs=4, caching=False)
    old, new = req("old", 12, max_new_tokens=12), req("new", 12, start=40, max_new_tokens=12)
    s.add_request(old)
    s.add_request(new)
    step(s)
    assert old.status is RequestStatus.RUNNING and new.status is RequestStatus.RUNNING
    while s.num_preemptions == 0:
        step(s)
    assert new.status is RequestStatus.WAITING and s.waiting[0] is new
    assert new.num_computed_tokens == 0 and new.pages == [] and new.num_output_tokens > 0
    assert old.status is RequestStatus.RUNNING
    run_all(s)
    assert old.num_output_tokens == 12 and new.num_output_tokens == 12
    assert_idle(s)


def test_first_scheduled_time_is_the_first_batch_and_survives_preemption():
    s = make(num_pages=9, bs=4, caching=False, max_num_seqs=2)
    old, new = req("old", 12, max_new_tokens=12), req("new", 12, start=40, max_new_tokens=12)
    late = req("late", 4, start=80, max_new_tokens=2)
    for r in (old, new, late):
        s.add_request(r)
    before = time.time()
    step(s)
    first = new.first_scheduled_time
    assert first is not None and before <= first <= time.time()
    assert old.first_scheduled_time == first
    assert late.first_scheduled_time is None  # max_num_seqs=2: still waiting
    while s.num_preemptions == 0:
        step(s)
    assert new.status is RequestStatus.WAITING and new.first_scheduled_time == first
    while new.status is not RequestStatus.RUNNING and not new.is_finished:
        step(s)
    run_all(s)
    assert new.num_preemptions > 0 and new.first_scheduled_time == first  # rescheduling keeps the first time
    assert late.first_scheduled_time is not None and late.first_scheduled_time > first
    assert_idle(s)


def test_preempted_request_recomputes_from_the_prefix_cache():
    s = make(num_pages=9, bs=4, caching=True)
    s.add_request(req("old", 12, max_new_tokens=12))
    new = req("new", 12, start=40, max_new_tokens=12)
    s.add_request(new)
    while s.num_preemptions == 0:
        step(s)
    run_all(s)
    assert new.num_output_tokens == 12 and s.kv.hit_tokens > 0
    assert_idle(s)


def test_a_request_larger_than_the_pool_finishes_with_length():
    s = make(num_pages=5, bs=4)  # 16 tokens
    r = req("r", 10, max_new_tokens=50)
    s.add_request(r)
    run_all(s)
    assert r.finish_reason == "length" and r.num_tokens == 17  # 16 in the cache + the last sampled
    assert_idle(s)


def test_finish_reasons():
    s = make()
    stop = req("stop", 3, stop_token_ids=[9])
    eos = req("eos", 3, start=30)
    ignore = req("ignore", 3, start=40, ignore_eos=True, max_new_tokens=3)
    minimum = req("min", 3, start=50, min_new_tokens=2, max_new_tokens=5)
    for r in (stop, eos, ignore, minimum):
        s.add_request(r)
    batch = s.schedule()
    s.update_from_output(batch, [9, EOS, EOS, EOS])
    assert (stop.finish_reason, stop.matched_stop) == ("stop", 9)
    assert (eos.finish_reason, eos.matched_stop) == ("stop", EOS)
    assert not ignore.is_finished and not minimum.is_finished  # EOS before min_new_tokens does not end it
    step(s, token=EOS)
    assert (minimum.finish_reason, minimum.num_output_tokens) == ("stop", 2)
    step(s, token=EOS)
    assert ignore.finish_reason == "length" and ignore.output_ids == [EOS, EOS, EOS]
    assert_idle(s)


def test_max_model_len_ends_a_request():
    s = make(max_len=8)
    r = req("r", 5, max_new_tokens=None)
    s.add_request(r)
    run_all(s)
    assert r.finish_reason == "length" and r.num_tokens == 8


def test_abort_frees_pages_for_running_and_waiting_requests():
    s = make(max_num_seqs=1)
    a, b = req("a", 9), req("b", 9, start=50)
    s.add_request(a)
    s.add_request(b)
    step(s)
    assert s.abort_request("a") and s.abort_request("b", reason="stop")
    assert not s.abort_request("a") and not s.abort_request("nope")
    assert (a.finish_reason, b.finish_reason) == ("abort", "stop")
    assert {r.rid for r in s.pop_outbox()} >= {"a", "b"}
    assert_idle(s)


def test_prefix_hits_leave_the_last_token_to_compute():
    s = make(bs=4)
    s.add_request(req("a", 12, max_new_tokens=1))
    run_all(s)
    again = req("again", 12, max_new_tokens=1)
    s.add_request(again)
    batch = step(s)
    # 12 cached tokens, but the last must be computed to get logits: 2 pages hit, 4 tokens computed.
    assert plan(batch) == [("again", 4)] and again.num_cached_tokens == 8
    assert s.kv.hit_tokens == 8 and s.kv.query_tokens == 24
    assert_idle(s)
