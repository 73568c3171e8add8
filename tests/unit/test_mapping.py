"""Group membership, placement and errors of ``Mapping``."""

from __future__ import annotations

import json

import pytest

from tokenspeed.config.cli import prepare_server_args
from tokenspeed.config.resolve import PlatformFacts
from tokenspeed.runtime.distributed.mapping import GROUP_KINDS, Mapping, resolve_parallelism_sizes

TP4_DP2 = Mapping(world_size=8, attn_tp_size=4, attn_dp_size=2, dense_tp_size=8)

# (id, mapping, group kind, expected groups)
GROUPS = [
    ("tp4 dp2 attn tp", TP4_DP2, "attn_tp", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("tp4 dp2 attn dp", TP4_DP2, "attn_dp", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("tp4 dp2 attn cp", TP4_DP2, "attn_cp", [[r] for r in range(8)]),
    ("tp4 dp2 dense tp", TP4_DP2, "dense_tp", [list(range(8))]),
    ("tp4 dp2 dense dp", TP4_DP2, "dense_dp", [[r] for r in range(8)]),
    ("tp4 dp2 moe tp", TP4_DP2, "moe_tp", [list(range(8))]),
    ("tp4 dp2 moe ep", TP4_DP2, "moe_ep", [[r] for r in range(8)]),
    ("ep8", Mapping(world_size=8, attn_tp_size=8, moe_tp_size=1, moe_ep_size=8), "moe_ep", [list(range(8))]),
    (
        "ep8 moe tp",
        Mapping(world_size=8, attn_tp_size=8, moe_tp_size=1, moe_ep_size=8),
        "moe_tp",
        [[r] for r in range(8)],
    ),
    (
        "ep4 moe dp2",
        Mapping(world_size=8, moe_tp_size=1, moe_ep_size=4),
        "moe_ep",
        [[0, 1, 2, 3], [4, 5, 6, 7]],
    ),
    (
        "ep4 moe dp2 dp",
        Mapping(world_size=8, moe_tp_size=1, moe_ep_size=4),
        "moe_dp",
        [[0, 4], [1, 5], [2, 6], [3, 7]],
    ),
    ("moe tp2 ep2", Mapping(world_size=4, moe_tp_size=2, moe_ep_size=2), "moe_tp", [[0, 1], [2, 3]]),
    ("moe tp2 ep2 ep", Mapping(world_size=4, moe_tp_size=2, moe_ep_size=2), "moe_ep", [[0, 2], [1, 3]]),
    ("cp4", Mapping(world_size=4, attn_tp_size=1, attn_cp_size=4), "attn_cp", [[0, 1, 2, 3]]),
    ("tp2 cp2", Mapping(world_size=4, attn_tp_size=2, attn_cp_size=2), "attn_cp", [[0, 2], [1, 3]]),
    (
        "tp2 cp2 dp2",
        Mapping(world_size=8, attn_tp_size=2, attn_cp_size=2),
        "attn_dp",
        [[0, 4], [1, 5], [2, 6], [3, 7]],
    ),
    ("dense tp2 of 4", Mapping(world_size=4, dense_tp_size=2), "dense_dp", [[0, 2], [1, 3]]),
]


@pytest.mark.parametrize(("mapping", "kind", "expected"), [g[1:] for g in GROUPS], ids=[g[0] for g in GROUPS])
def test_groups(mapping, kind, expected):
    assert mapping.groups(kind) == expected


@pytest.mark.parametrize("kind", GROUP_KINDS)
def test_groups_partition_the_ranks(kind):
    mapping = Mapping(world_size=16, attn_tp_size=2, attn_cp_size=2, moe_tp_size=1, moe_ep_size=4)
    ranks = sorted(r for group in mapping.groups(kind) for r in group)
    assert ranks == list(range(16))


def test_group_of_and_placement():
    assert TP4_DP2.group_of("attn_tp", 6) == [4, 5, 6, 7]
    placement = TP4_DP2.placement(6)
    assert (placement.attn_tp_rank, placement.attn_dp_rank, placement.dense_tp_rank) == (2, 1, 6)


def test_nodes_and_gpu_ids():
    mapping = Mapping(world_size=8, attn_tp_size=8, nnodes=2, base_gpu_id=1, gpu_id_step=2)
    assert mapping.nprocs_per_node == 4
    assert [mapping.node_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [mapping.gpu_id(r) for r in range(8)] == [1, 3, 5, 7] * 2
    assert mapping.ranks_on_node(1) == [4, 5, 6, 7]
    assert mapping.placement(5).local_rank == 1


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ((8, None, 1, None), (8, 1, 1)),
        ((8, 2, 1, None), (2, 1, 4)),
        ((8, None, 1, 2), (4, 1, 2)),
        ((8, 1, None, None), (1, 8, 1)),
        ((8, 2, 2, 2), (2, 2, 2)),
    ],
)
def test_resolve_parallelism_sizes(sizes, expected):
    assert resolve_parallelism_sizes(*sizes) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 6, "attn_tp_size": 4}, "--tp"),
        ({"world_size": 8, "attn_tp_size": 2, "attn_dp_size": 2}, "multiply to 4"),
        ({"world_size": 8, "dense_tp_size": 3}, "--dense-tp-size"),
        ({"world_size": 8, "moe_ep_size": 3}, "--ep-size"),
        ({"world_size": 8, "moe_tp_size": 2, "moe_ep_size": 2, "moe_dp_size": 3}, "multiply to 12"),
        ({"world_size": 8, "nnodes": 3}, "--nnodes"),
        ({"world_size": 8, "nprocs_per_node": 3}, "--nprocs-per-node"),
        ({"world_size": 0}, "--world-size"),
        ({"world_size": 4, "attn_tp_size": 0}, "must be >= 1"),
        ({"world_size": 4, "gpu_id_step": 0}, "--gpu-id-step"),
        ({"world_size": 4, "base_gpu_id": -1}, "--base-gpu-id"),
    ],
)
def test_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Mapping(**kwargs)


def test_rank_out_of_range():
    with pytest.raises(ValueError, match="rank 8"):
        TP4_DP2.placement(8)
    with pytest.raises(ValueError, match="unknown group kind"):
        TP4_DP2.groups("pp")


def test_to_dict_is_json_and_complete():
    data = json.loads(json.dumps(TP4_DP2.to_dict()))
    assert data["world_size"] == 8
    assert data["groups"]["attn_tp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(data["ranks"]) == 8 and data["ranks"][5]["attn_dp_rank"] == 1


def test_table():
    table = TP4_DP2.table()
    lines = table.splitlines()
    assert "world_size=8" in lines[0]
    assert lines[2].split() == ["attention", "4", "1", "-", "2"]
    assert len(lines) == 6 + 8
    assert lines[-1].split() == ["7", "0", "7", "3/0/1", "7/0", "7/0/0"]
    assert str(TP4_DP2) == table


def test_from_server_args_matches_resolved_mapping():
    args = prepare_server_args(["M", "--tp", "4", "--data-parallel-size", "2"], platform=PlatformFacts("cpu"))
    assert Mapping.from_server_args(args) == args.mapping == TP4_DP2
    assert Mapping.from_server_args(args, enable_cp=True).attn_cp_size == 4


def test_to_dict_carries_the_table():
    assert TP4_DP2.to_dict()["table"] == TP4_DP2.table()
