"""The typed slices built once from a resolved ServerArgs, and the resolved ServerArgs staying as resolved."""

import dataclasses
import logging

import pytest

from tokenspeed.config.cli import prepare_server_args
from tokenspeed.config.resolve import PlatformFacts
from tokenspeed.config.slices import KEPT_BY_EPLB, ExpertPlan, GraphConfig, RunnerConfig

HOPPER = PlatformFacts(kind="nvidia", is_hopper_or_newer=True, gpu_memory_gb=80)


def resolve(argv, platform=HOPPER):
    return prepare_server_args(["MODEL", *argv], platform=platform)


def test_resolved_args_are_frozen_and_copied_with_replace():
    args = resolve(["--tp", "2"])
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"dataclasses.replace\(args, port=...\)"):
        args.port = 9000
    wider = dataclasses.replace(args, attn_tp_size=4)
    # the copy is resolved again, against the same platform: its mapping follows the new size
    assert wider.mapping.world_size == 4 and args.mapping.world_size == 2
    assert wider.sampling_backend == "flashinfer"


def test_runner_config_on_cpu_has_resolved_values():
    config = RunnerConfig.from_server_args(resolve(["--device", "cpu"], platform=None))
    assert config.device == "cpu" and config.attention_backend == "torch"
    assert config.sampling_backend == "torch" and config.disable_overlap_schedule
    assert config.max_num_seqs == 160 and config.stream_interval == 1
    assert isinstance(config.seed, int)


def test_graph_config_follows_the_eager_rules():
    assert GraphConfig.from_server_args(resolve(["--device", "cpu"], platform=None)).enforce_eager
    plain = GraphConfig.from_server_args(resolve(["--max-cudagraph-capture-size", "64"]))
    assert not plain.enforce_eager and plain.max_capture_size == 64 and plain.pad
    explicit = GraphConfig.from_server_args(resolve(["--cudagraph-capture-sizes", "1", "4", "8"]))
    assert explicit.capture_sizes == (1, 4, 8)


def test_per_token_recording_turns_graphs_off_in_resolution_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="tokenspeed.config.resolve"):
        args = resolve(["--tp", "2", "--ep-size", "2", "--expert-distribution-recorder-mode", "per_token"])
    assert args.enforce_eager
    assert GraphConfig.from_server_args(args).enforce_eager
    assert any("CUDA graphs off" in r.getMessage() for r in caplog.records)


def test_expert_plan():
    plain = ExpertPlan.from_server_args(resolve([]))
    assert not plain.moves_experts and plain.kept_by is None and plain.recorder_mode is None
    eplb = ExpertPlan.from_server_args(resolve(["--tp", "2", "--ep-size", "2", "--enable-eplb"]))
    assert eplb.moves_experts and eplb.ep_size == 2
    assert eplb.recorder_mode == "stat" and eplb.dispatch_algorithm == "static"
    assert eplb.kept_by == KEPT_BY_EPLB
