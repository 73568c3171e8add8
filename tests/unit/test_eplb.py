"""EPLB placement, expert location and the distribution recorder."""

import json

import pytest
import torch

from tokenspeed.runtime.moe.distribution_recorder import ExpertDistributionRecorder
from tokenspeed.runtime.moe.eplb_algorithm import (
    balancedness,
    rank_loads,
    rebalance_experts,
    resolve_algorithm,
)
from tokenspeed.runtime.moe.expert_location import ExpertLocation


def skewed_load(layers=4, experts=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(1, 50, (layers, experts), generator=g).float()
    w[:, 3] *= 30  # one hot expert per layer
    return w


def check_consistent(p, num_logical):
    layers, num_physical = p.phy2log.shape
    assert int(p.logcnt.sum(-1).unique()) == num_physical
    for layer in range(layers):
        for e in range(num_logical):
            slots = p.log2phy[layer, e]
            slots = slots[slots >= 0]
            assert len(slots) == int(p.logcnt[layer, e])
            assert (p.phy2log[layer, slots] == e).all()


@pytest.mark.parametrize(
    "algo,groups,nodes,ranks,redundant",
    [("deepseek", 1, 1, 4, 8), ("deepseek", 1, 1, 8, 0), ("deepseek_hierarchical", 4, 2, 4, 8)],
)
def test_rebalance_is_a_valid_placement_and_beats_trivial(algo, groups, nodes, ranks, redundant):
    w = skewed_load()
    p = rebalance_experts(w, 16 + redundant, ranks, num_groups=groups, num_nodes=nodes, algorithm=algo)
    check_consistent(p, 16)
    trivial = ExpertLocation.trivial(4, 16, 0, ranks)
    before = balancedness(rank_loads(w, trivial.placement, ranks))
    after = balancedness(rank_loads(w, p, ranks))
    assert (after >= before - 1e-6).all()
    if redundant:
        assert after.mean() > before.mean() + 0.1
        assert int(p.logcnt[:, 3].min()) > 1  # the hot expert got replicas


def test_auto_picks_hierarchical_only_when_groups_divide_nodes():
    assert resolve_algorithm("auto", 4, 2) == "deepseek_hierarchical"
    assert resolve_algorithm("auto", 3, 2) == "deepseek"
    assert resolve_algorithm("auto", 4, 1) == "deepseek"
    with pytest.raises(ValueError, match="--eplb-algorithm"):
        resolve_algorithm("greedy", 1, 1)


def test_indivisible_slots_name_the_flag():
    with pytest.raises(ValueError, match="--ep-num-redundant-experts"):
        rebalance_experts(skewed_load(), 17, 4)
    with pytest.raises(ValueError, match="--ep-num-redundant-experts"):
        ExpertLocation.trivial(2, 16, 1, 4)


def test_init_expert_location_from_files(tmp_path):
    w = skewed_load(layers=2, experts=8)
    counts_file = tmp_path / "counts.json"
    counts_file.write_text(json.dumps({"logical_count": w.tolist()}))
    loc = ExpertLocation.from_init_arg(str(counts_file), 2, 8, 4, 4)
    assert loc.num_physical == 12 and loc.slots_per_rank == 3
    check_consistent(loc.placement, 8)
    map_file = tmp_path / "map.json"
    map_file.write_text(json.dumps({"physical_to_logical_map": loc.placement.phy2log.tolist()}))
    again = ExpertLocation.from_init_arg(str(map_file), 2, 8, 4, 4)
    assert torch.equal(again.placement.logcnt, loc.placement.logcnt)
    with pytest.raises(ValueError, match="no such file"):
        ExpertLocation.from_init_arg(str(tmp_path / "missing.json"), 2, 8, 0, 1)


@pytest.mark.parametrize("algorithm", ["static", "dynamic"])
def test_dispatch_maps_to_replicas_of_the_chosen_expert(algorithm):
    loc = ExpertLocation.from_counts(skewed_load(layers=1, experts=8), num_redundant=4, ep_size=4)
    topk = torch.tensor([[3, e % 8] for e in range(12)])
    phys = loc.dispatch(0, topk, algorithm, ep_rank=1)
    assert (loc.placement.phy2log[0][phys] == topk).all()
    if algorithm == "dynamic":
        assert len(set(phys[:, 0].tolist())) == int(loc.placement.logcnt[0, 3])


@pytest.mark.parametrize("mode", ["stat", "stat_approx", "per_pass", "per_token"])
def test_recorder_counts_tokens_per_expert(mode, tmp_path):
    rec = ExpertDistributionRecorder(mode, num_layers=2, num_physical_experts=4, buffer_size=-1)
    rec.record(0, torch.tensor([[0, 1]]))  # not recording yet: ignored
    rec.start()
    for _ in range(3):
        rec.record(0, torch.tensor([[0, 1], [0, 2]]))
        rec.record(1, torch.tensor([[3, 3]]))
        rec.end_pass()
    counts = rec.window_counts()
    assert counts.tolist() == [[6, 3, 3, 0], [0, 0, 0, 6]]
    out = rec.dump(tmp_path / "dist.pt")
    assert (tmp_path / "dist.pt").exists() and out["passes"] == 3
    if mode in ("per_pass", "per_token"):
        assert len(out["per_pass"]) == 3
    if mode == "per_token":
        assert out["per_token"][0][1].tolist() == [[3, 3]]
    rec.stop()
    rec.record(0, torch.tensor([[0, 0]]))
    rec.end_pass()
    assert rec.window_counts().tolist() == counts.tolist()


def test_recorder_ring_buffer_keeps_the_last_passes():
    rec = ExpertDistributionRecorder("stat", 1, 2, buffer_size=2, kept_by="test")
    for e in (0, 1, 1):
        rec.record(0, torch.tensor([[e]]))
        rec.end_pass()
    assert rec.window_counts().tolist() == [[0, 2]]
    with pytest.raises(ValueError, match="recorder-mode"):
        ExpertDistributionRecorder("bogus", 1, 2)


def test_a_rebalance_never_leaves_a_layer_less_balanced():
    """The greedy packing is not optimal: for this load the placement in use (built for another load)
    balances 0.98 and the fresh one 0.94, so that layer keeps its placement."""
    from tokenspeed.runtime.moe.eplb_algorithm import balancedness, rank_loads, worse_layers

    counts = torch.tensor([[4.0, 1.0, 8.0, 7.0, 14.0, 2.0, 5.0, 8.0], [9.0, 1.0, 1.0, 1.0, 9.0, 1.0, 1.0, 1.0]])
    old = ExpertLocation.from_phy2log(
        torch.tensor([[0, 6, 5, 4, 1, 7, 2, 3], [0, 4, 1, 2, 3, 5, 6, 7]]), num_logical=8, ep_size=2
    ).placement
    new = ExpertLocation.from_counts(counts, num_redundant=0, ep_size=2).placement
    old_bal = balancedness(rank_loads(counts, old, 2)).tolist()
    new_bal = balancedness(rank_loads(counts, new, 2)).tolist()
    assert new_bal[0] < old_bal[0] and new_bal[1] > old_bal[1], (old_bal, new_bal)
    assert worse_layers(counts, old, new, 2).tolist() == [True, False]
