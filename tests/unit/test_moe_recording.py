"""Expert recording in persistent device buffers (what a captured CUDA graph keeps writing), the MoE
backend registry, and a live rebalance that moves experts in place."""

from __future__ import annotations

import pytest
import torch

from tokenspeed.runtime.moe.backend import TorchMoe, count_routed, resolve_moe_backend
from tokenspeed.runtime.moe.dispatch import ExpertDispatch
from tokenspeed.runtime.moe.distribution_recorder import ExpertDistributionRecorder
from tokenspeed.runtime.moe.expert_counts import ExpertCounts
from tokenspeed.runtime.moe.expert_location import ExpertLocation


def _pass(counts: ExpertCounts, layer: int, experts: list[int]) -> None:
    counts.row(layer).index_add_(0, torch.tensor(experts), torch.ones(len(experts), dtype=torch.int32))
    counts.end_pass()


def test_counts_fold_into_int64_without_moving_the_live_buffer():
    c = ExpertCounts(2, 4, fold_passes=3)
    ptr = c.row(1).data_ptr()
    for i in range(10):
        _pass(c, 1, [i % 4, 3])
    assert c.row(1).data_ptr() == ptr  # what a captured graph adds into never moves
    assert c.read().tolist() == [[0, 0, 0, 0], [3, 3, 2, 12]]
    assert c.acc.dtype == torch.int64 and int(c.live.sum()) == 2  # 9 passes folded, one live


@pytest.mark.parametrize("window", [1, 3, 64])
def test_window_of_the_last_n_passes_is_exact_up_to_64(window):
    c = ExpertCounts(1, 200, window=window, fold_passes=5)
    for i in range(150):
        _pass(c, 0, [i])
    got = c.read()[0]
    assert got.nonzero().flatten().tolist() == list(range(150 - window, 150))


def test_long_window_covers_at_least_n_passes_and_at_most_n_plus_n_over_64():
    c = ExpertCounts(1, 1000, window=200)
    for i in range(900):
        _pass(c, 0, [i])
    got = int(c.read().sum())
    assert 200 <= got <= 200 + c.stride


def test_restart_and_async_read_on_cpu():
    c = ExpertCounts(1, 2)
    _pass(c, 0, [0, 0])
    c.restart()
    _pass(c, 0, [1])
    assert c.read_async(1.0).tolist() == [[0, 1]]


def test_recorder_keeps_one_sink_and_freezes_a_stopped_session():
    rec = ExpertDistributionRecorder("stat", 2, 4)
    sink = rec.device_counts(1)
    ptr = sink.data_ptr()
    rec.start()
    sink.index_add_(0, torch.tensor([2, 2, 3]), torch.ones(3, dtype=torch.int32))  # as the graph does
    rec.end_pass()
    rec.stop()
    sink.index_add_(0, torch.tensor([0]), torch.ones(1, dtype=torch.int32))  # a graph still counts
    rec.end_pass()
    assert rec.window_counts()[1].tolist() == [0, 0, 2, 1]
    assert rec.metrics_counts()[1].tolist() == [0, 0, 2, 1]
    rec.start()
    assert rec.window_counts().sum() == 0
    assert rec.device_counts(1).data_ptr() == ptr
    assert ExpertDistributionRecorder("per_token", 1, 4).device_counts(0) is None


def test_reference_routing_counts_only_live_rows_and_dispatches_to_replicas():
    loc = ExpertLocation.trivial(num_layers=1, num_logical=4, num_redundant=2, ep_size=1)
    dispatch = ExpertDispatch(loc, max_replicas=3)
    view = dispatch.view(0, "dynamic", 1, 0, loc.slots_per_rank)
    logits = torch.tensor([[9.0, 1, 0, 0], [9.0, 0, 1, 0], [0.0, 1, 0.5, 9]])
    counts = torch.zeros(6, dtype=torch.int32)
    mask = torch.tensor([7, 8, 0])  # the last row is CUDA-graph padding (KV slot 0)
    weights, ids = TorchMoe().route(logits, 2, True, view, counts, mask)
    phy2log = loc.placement.phy2log[0]
    assert phy2log[ids].tolist() == [[0, 1], [0, 2], [3, 1]]
    assert int(counts.sum()) == 4 and torch.allclose(weights.sum(-1), torch.ones(3))
    plain = torch.zeros(4, dtype=torch.int32)
    count_routed(plain, torch.tensor([[1, 2]]), None)
    assert plain.tolist() == [0, 1, 1, 0]


def test_moe_backend_registry():
    assert resolve_moe_backend("auto", "cpu") == "torch"
    assert resolve_moe_backend(None, "cpu") == "torch"
    try:
        import triton  # noqa: F401

        has_triton = True
    except ImportError:
        has_triton = False
    assert resolve_moe_backend("auto", "cuda") == ("triton" if has_triton else "torch")
    with pytest.raises(ValueError, match="--moe-backend 'cutlass' is not available.*auto, torch, triton"):
        resolve_moe_backend("cutlass", "cpu")
    from tokenspeed.runtime.moe.backend import create_moe_backend

    with pytest.raises(ValueError, match="--moe-backend triton needs a CUDA GPU"):
        create_moe_backend("triton", "cpu")


def test_rebalance_moves_experts_in_place_and_keeps_greedy_output(tmp_path):
    """Redundant experts on one rank: the rebalance rewrites the weights and dispatch tables in place (the
    tensors a captured graph reads stay the same objects) and greedy output does not change."""
    from tests.tiny_models import make_tiny_model
    from tokenspeed import Engine

    path = make_tiny_model("qwen3_moe", tmp_path)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    params = {"max_new_tokens": 6, "temperature": 0.0}
    opts = dict(device="cpu", dtype="float32", block_size=4, max_total_tokens=512)
    with Engine(model=path, **opts) as engine:
        expected = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
    with Engine(
        model=path, enable_expert_distribution_metrics=True, ep_num_redundant_experts=4, **opts
    ) as engine:
        assert [
            o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)
        ] == expected
        assert sum(map(sum, engine.get_stats().expert_load)) > 0
        experts = engine.core.experts
        state = experts.state
        layer = state.layers[min(state.layers)]
        ptrs = [layer.w13.data_ptr(), layer.w2.data_ptr(), state.dispatch.log2phy.data_ptr()]
        before = state.location.placement.phy2log.clone()
        experts.request_rebalance()
        outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
        assert outs == expected
        last = experts.eplb.stats.last
        assert last is not None and last.moved_slots > 0 and last.seconds >= 0
        after = state.location.placement.phy2log
        assert not torch.equal(before, after)
        assert [layer.w13.data_ptr(), layer.w2.data_ptr(), state.dispatch.log2phy.data_ptr()] == ptrs
        # replicas of one expert hold the same weights, whichever slots they were moved to
        row = after[layer.layer_id]
        for logical in row.unique().tolist():
            slots = (row == logical).nonzero().flatten().tolist()
            for slot in slots[1:]:
                assert torch.equal(layer.w13[slot], layer.w13[slots[0]])
                assert torch.equal(layer.w2[slot], layer.w2[slots[0]])


@pytest.mark.parametrize(
    "flags",
    [
        ["--enable-expert-distribution-metrics"],
        ["--expert-distribution-recorder-mode", "per_pass"],
        ["--ep-num-redundant-experts", "4", "--enable-eplb"],
        ["--tp", "2", "--ep-size", "2", "--enable-eplb"],
    ],
)
def test_expert_setups_keep_cuda_graphs(flags):
    from tokenspeed.config.cli import prepare_server_args
    from tokenspeed.config.resolve import PlatformFacts

    hopper = PlatformFacts(kind="nvidia", is_hopper_or_newer=True, gpu_memory_gb=80)
    args = prepare_server_args(["MODEL", *flags], platform=hopper)
    assert args.device == "cuda" and not args.enforce_eager
