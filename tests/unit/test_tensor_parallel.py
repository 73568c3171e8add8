"""Tensor and expert parallelism over gloo on the CPU: sharded logits equal the single-process model's.

One spawn of 4 ranks runs every case: the 2-way cases as two attention-DP replicas of a 2-rank group (TP=2
on Llama, Qwen2 and Qwen3; MoE TP=2 and EP=2 with and without redundant experts, both dispatch algorithms,
a placement from a counts file), and 4-way cases with more ranks than KV heads (replicated KV heads) and
EP=4 with redundancy. Rank 0 saves its logits; the other group's rank 0 must agree with it too.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.fp8_models import make_fp8_pair
from tests.tiny_models import make_tiny_model
from tests.unit.tensor_parallel_harness import Case, reference_logits, run_ranks

ATOL = 1e-4
TP2 = {"attn_tp_size": 2, "attn_dp_size": 2, "dense_tp_size": 2, "moe_tp_size": 2, "moe_ep_size": 1}
EP2 = {"attn_tp_size": 2, "attn_dp_size": 2, "dense_tp_size": 2, "moe_tp_size": 1, "moe_ep_size": 2}
TP4 = {"attn_tp_size": 4, "dense_tp_size": 4, "moe_tp_size": 4, "moe_ep_size": 1}
EP4 = {"attn_tp_size": 4, "dense_tp_size": 4, "moe_tp_size": 1, "moe_ep_size": 4}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-models")
    paths = {
        "llama": make_tiny_model("llama", root / "llama", tie_word_embeddings=True),
        "qwen2": make_tiny_model("qwen2", root / "qwen2"),
        "qwen3": make_tiny_model("qwen3", root / "qwen3"),
        "qwen3_moe": make_tiny_model("qwen3_moe", root / "qwen3_moe"),
    }
    counts = torch.ones(2, 8)
    counts[:, 5] = 40.0  # one hot expert per layer: it gets the redundant slots
    counts_file = root / "counts.json"
    counts_file.write_text(json.dumps({"logical_count": counts.tolist()}))
    # FP8 checkpoints of the same weights: block-wise 16x16 tiles (every TP split here falls on tile
    # edges) and per-channel scales
    paths["qwen3_fp8_block"] = make_fp8_pair(paths["qwen3"], root, "block")[0]
    paths["moe_fp8_block"] = make_fp8_pair(paths["qwen3_moe"], root, "block")[0]
    paths["moe_fp8_channel"] = make_fp8_pair(paths["qwen3_moe"], root, "channel")[0]
    return paths, str(counts_file)


def eplb(redundant: int, dispatch: str) -> dict[str, int | str]:
    """ExpertPlan fields: `redundant` replica slots and the `dispatch` algorithm that picks among them."""
    return {"num_redundant_experts": redundant, "dispatch_algorithm": dispatch}


def all_cases(paths, counts_file):
    moe = paths["qwen3_moe"]
    return [
        Case("llama_tp2_tied", paths["llama"], TP2),
        Case("qwen2_tp2_bias", paths["qwen2"], TP2),
        Case("qwen3_tp2", paths["qwen3"], TP2),
        Case("moe_tp2", moe, TP2, record=True),
        Case("moe_ep2_static", moe, EP2, {"dispatch_algorithm": "static"}, record=True),
        Case("moe_ep2_r2_dynamic", moe, EP2, eplb(2, "dynamic")),
        Case(
            "moe_ep2_r4_file_static",
            moe,
            EP2,
            {"num_redundant_experts": 4, "init_expert_location": counts_file, "dispatch_algorithm": "static"},
            record=True,
        ),
        Case("moe_ep2_r2_rebalance_static", moe, EP2, eplb(2, "static"), record=True, rebalance_after=1),
        Case("moe_ep4_r4_rebalance_dynamic", moe, EP4, eplb(4, "dynamic"), record=True, rebalance_after=2),
        # FP8 experts (--quantization fp8, quantized per rank at load): a live rebalance moves each
        # expert's FP8 weights with their scales, so the outputs stay those of the placement before
        Case("moe_ep2_fp8_static", moe, EP2, {"dispatch_algorithm": "static"}, quantization="fp8"),
        Case(
            "moe_ep2_fp8_r2_rebalance_static",
            moe,
            EP2,
            eplb(2, "static"),
            record=True,
            rebalance_after=1,
            quantization="fp8",
        ),
        # FP8 checkpoints sharded: weights and scales split alike (block scales by whole tiles)
        Case("qwen3fp8_tp2_block", paths["qwen3_fp8_block"], TP2),
        Case("qwen3fp8_tp4_block_replicated_kv", paths["qwen3_fp8_block"], TP4),
        Case("moefp8_tp2_channel", paths["moe_fp8_channel"], TP2),
        Case("moefp8_ep2_r2_block", paths["moe_fp8_block"], EP2, {"num_redundant_experts": 2}),
        Case("qwen3_tp4_replicated_kv", paths["qwen3"], TP4),
        Case("moe_ep4_r4_dynamic", moe, EP4, eplb(4, "dynamic")),
    ]


@pytest.fixture(scope="module")
def results(models, tmp_path_factory):
    paths, counts_file = models
    out = tmp_path_factory.mktemp("tp-out")
    run_ranks(4, all_cases(paths, counts_file), out)
    refs = {arch: reference_logits(path) for arch, path in paths.items()}
    return out, refs, paths


ALL_CASES = [
    ("llama_tp2_tied", "llama"),
    ("qwen2_tp2_bias", "qwen2"),
    ("qwen3_tp2", "qwen3"),
    ("moe_tp2", "qwen3_moe"),
    ("moe_ep2_static", "qwen3_moe"),
    ("moe_ep2_r2_dynamic", "qwen3_moe"),
    ("moe_ep2_r4_file_static", "qwen3_moe"),
    ("moe_ep2_r2_rebalance_static", "qwen3_moe"),
    ("moe_ep4_r4_rebalance_dynamic", "qwen3_moe"),
    ("qwen3_tp4_replicated_kv", "qwen3"),
    ("moe_ep4_r4_dynamic", "qwen3_moe"),
    ("qwen3fp8_tp2_block", "qwen3_fp8_block"),
    ("qwen3fp8_tp4_block_replicated_kv", "qwen3_fp8_block"),
    ("moefp8_tp2_channel", "moe_fp8_channel"),
    ("moefp8_ep2_r2_block", "moe_fp8_block"),
]


@pytest.mark.parametrize("case,arch", ALL_CASES)
def test_sharded_logits_equal_single_process(results, case, arch):
    out, refs, _ = results
    got = torch.load(out / f"{case}.pt")["logits"]
    ref = refs[arch]
    assert len(got) == len(ref)
    for step, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert a.shape == b.shape
        err = (a - b).abs().max().item()
        assert err < ATOL, f"{case} step {step}: max |logit diff| {err:.2e}"
        assert torch.equal(a.argmax(-1), b.argmax(-1)), f"{case} step {step}: greedy tokens differ"
    replicas = sorted(out.glob(f"{case}.rank*.logits.pt"))
    assert len(replicas) == (1 if "4" in case.split("_")[1] else 2)
    for path in replicas:
        for a, b in zip(torch.load(path), got, strict=True):
            assert torch.equal(a, b), f"{case}: {path.name} differs from rank 0"


def test_recorded_load_is_the_same_routing_under_every_placement(results):
    """Logical expert loads recorded on physical slots agree between MoE TP, EP and EP with replicas."""
    out, _, _ = results
    logical = {}
    for case in ("moe_tp2", "moe_ep2_static", "moe_ep2_r4_file_static"):
        r = torch.load(out / f"{case}.pt")
        counts = r["counts"]
        if r["phy2log"] is not None:
            per_logical = torch.zeros(counts.shape[0], 8, dtype=torch.int64)
            per_logical.scatter_add_(1, r["phy2log"], counts)
            counts = per_logical
        logical[case] = counts
    assert logical["moe_tp2"].sum() > 0
    assert torch.equal(logical["moe_tp2"], logical["moe_ep2_static"])
    assert torch.equal(logical["moe_tp2"], logical["moe_ep2_r4_file_static"])
    # with the hot expert replicated, the static dispatch spread it over more than one slot
    r = torch.load(out / "moe_ep2_r4_file_static.pt")
    hot_slots = (r["phy2log"][0] == 5).nonzero().flatten()
    assert len(hot_slots) > 1


@pytest.mark.parametrize("case", ["moe_ep2_r2_rebalance_static", "moe_ep4_r4_rebalance_dynamic"])
def test_live_rebalance_moves_experts_and_balances_the_recorded_load(results, case):
    """The rebalance mid-run changed the placement (the logits test above shows outputs did not change)."""
    from tokenspeed.runtime.moe.eplb_algorithm import balancedness
    from tokenspeed.runtime.moe.eplb_manager import logical_counts

    out, _, _ = results
    r = torch.load(out / f"{case}.pt")
    (reb,) = r["rebalances"]
    before, after = reb["before"], r["phy2log"]
    assert not torch.equal(before, after), "the placement did not change"
    assert reb["result"]["moved_slots"] > 0
    # every logical expert still has a slot, and the recorded tokens were the routed ones
    for layer in range(after.shape[0]):
        assert set(after[layer].tolist()) == set(range(8))
    counts = reb["counts"]
    assert int(counts.sum()) > 0
    ep = 2 if "ep2" in case else 4
    logical = logical_counts(counts, before, 8)

    def per_rank(phy2log):
        cnt = torch.zeros_like(logical)
        cnt.scatter_add_(1, phy2log, torch.ones_like(phy2log, dtype=cnt.dtype))
        per_slot = (logical / cnt).gather(1, phy2log)
        return per_slot.view(per_slot.shape[0], ep, -1).sum(-1)

    assert (balancedness(per_rank(after)) >= balancedness(per_rank(before)) - 1e-6).all()
    assert reb["result"]["balancedness_after"] == [round(float(x), 4) for x in balancedness(per_rank(after))]


def test_fp8_experts_move_with_their_scales(results):
    out, _, _ = results
    still = torch.load(out / "moe_ep2_fp8_static.pt")["logits"]
    moved = torch.load(out / "moe_ep2_fp8_r2_rebalance_static.pt")
    (reb,) = moved["rebalances"]
    assert reb["result"]["moved_slots"] > 0 and not torch.equal(reb["before"], moved["phy2log"])
    for step, (a, b) in enumerate(zip(moved["logits"], still, strict=True)):
        err = (a - b).abs().max().item()
        assert err < ATOL, f"step {step} (rebalance after step 1): max |logit diff| {err:.2e}"
