"""The [server] table -> ServerArgs.from_dict -> a command line when a process starts: `tokenspeed serve`
resolves that command line to the supervisor's ServerArgs, and every mistake lands on its profile key
(file:line), found from the fields' types and by resolving without a key, never from a message's text."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from console.probe import load_probe
from console.profile import load_and_resolve
from console.profile.plan import plan_with_platform, platform_facts
from tests.console.profile_files import PROFILES, error_of, write
from tokenspeed.config.cli import prepare_server_args
from tokenspeed.config.resolution_check import EXPECTED_ENV, differences, expected_env

# Drawn at random unless given; the API key reaches a server through its environment, not its argv.
_NOT_ON_ARGV = {"seed", "api_key"}


def _comparable(args) -> dict:
    return {k: v for k, v in args.to_dict().items() if k not in _NOT_ON_ARGV}


@pytest.mark.parametrize(
    "path", sorted(p.name for p in PROFILES.glob("*.toml") if not p.name.startswith("_"))
)
def test_every_shipped_profile_resolves_like_its_command_line(path):
    resolved = load_and_resolve(PROFILES / path)
    for spec, args in zip(resolved.servers, resolved.server_args, strict=True):
        for process in spec.processes:
            served = prepare_server_args(list(process.argv))  # what its `tokenspeed serve` builds
            expected = dataclasses.replace(args, node_rank=served.node_rank, platform=None)
            assert _comparable(served) == _comparable(expected), process.argv


def test_planned_fields_reach_the_command_line_and_resolve_the_same(tmp_path):
    probe = load_probe(PROFILES.parent / "tests/console/data/h200x8-idle.json")
    path = write(tmp_path, '[server]\nmodel = "m"\nmax_model_len = 8192\n[fleet]\ngpus = [0]\n')
    resolved = load_and_resolve(path, platform_facts(probe))
    plan = plan_with_platform(resolved, probe).servers[0]
    assert set(plan.planned_fields) == {
        "gpu_memory_utilization",
        "max_cudagraph_capture_size",
        "cudagraph_capture_sizes",
    }
    process = resolved.servers[0].processes[0].with_fields(plan.planned_fields)
    served = prepare_server_args(list(process.argv), platform=platform_facts(probe))
    assert served.gpu_memory_utilization == plan.gpu_memory_utilization
    assert served.cudagraph_capture_sizes == plan.cudagraph_capture_sizes
    assert served.max_cudagraph_capture_size == plan.max_cudagraph_capture_size
    # and what the supervisor expects of it, the plan included, is what it resolves
    expected = dataclasses.replace(
        resolved.server_args[0], platform=platform_facts(probe), **plan.planned_fields
    )
    assert differences(served, expected_env(expected)[EXPECTED_ENV]) == []


@pytest.mark.parametrize(
    "server, line, key, message",
    [
        # the field's type, checked before anything resolves
        ('max_num_seqs = "8"', 3, "[server] max_num_seqs", "expects an integer, got '8'"),
        ("enforce_eager = 1", 3, "[server] enforce_eager", "expects true or false"),
        ('dtype = "float17"', 3, "[server] dtype", "did you mean 'float16'"),
        ("max_num_seq = 4", 3, "[server] max_num_seq", "did you mean 'max_num_seqs'"),
        ('host = "0.0.0.0"', 3, "[server] host", "use [fleet] host"),
        ("enable_kvstore = true", 3, "[server] enable_kvstore", "without a command-line flag"),
        # a resolution rule on one key: the key without which the profile resolves
        ("block_size = 0", 3, "[server] block_size", "--block-size must be >= 1"),
        # a rule across two keys: both named, the first where it is written
        (
            "data_parallel_size = 4\nmax_num_seqs = 2",
            3,
            "[server] data_parallel_size",
            "below the data parallel size 4; every replica needs at least one slot: raise --max-num-seqs "
            "(together with [server] max_num_seqs)",
        ),
    ],
)
def test_mistakes_land_on_their_profile_key(tmp_path, server, line, key, message):
    path = write(tmp_path, f'[server]\nmodel = "m"\n{server}\ndevice = "cpu"\n')
    error = error_of(path)
    assert (error.path, error.line, error.key) == (path.resolve(), line, key), str(error)
    assert message in str(error)


def test_a_group_mistake_lands_on_the_group_key_and_a_base_mistake_in_the_base(tmp_path):
    groups = write(
        tmp_path,
        """\
        [server]
        model = "m"
        device = "cpu"
        [groups.small]
        max_num_seqs = 8
        [groups.broken]
        block_size = 0
        """,
    )
    error = error_of(groups)
    assert (error.line, error.key) == (7, "[groups.broken] block_size") and "--block-size" in str(error)

    write(tmp_path, '[server]\ndevice = "cpu"\nmax_prefill_tokens = -5\n', "base.toml")
    child = write(tmp_path, 'extends = "base.toml"\n[server]\nmodel = "m"\n', "child.toml")
    error = error_of(child)
    assert error.path == (tmp_path / "base.toml").resolve() and error.key == "[server] max_prefill_tokens"


def test_flag_spellings_are_accepted_as_keys(tmp_path):
    path = write(tmp_path, '[server]\nmodel = "m"\ndevice = "cpu"\ntensor_parallel_size = 2\n')
    resolved = load_and_resolve(path)
    assert resolved.server_args[0].mapping.attn_tp_size == 2
    assert "--attn-tp-size" in resolved.servers[0].processes[0].argv


def test_the_server_names_what_it_resolved_otherwise_than_its_supervisor(tmp_path):
    """The supervisor's resolution travels in the server's environment; `tokenspeed serve` compares."""
    path = write(tmp_path, '[server]\nmodel = "demo"\ndevice = "cpu"\nmax_total_tokens = 4096\n')
    resolved = load_and_resolve(path)
    process = resolved.servers[0].processes[0]
    args = resolved.server_args[0]
    # What serve resolves from the command line is what the supervisor expects.
    assert differences(prepare_server_args(list(process.argv)), expected_env(args)[EXPECTED_ENV]) == []
    # A supervisor that resolved another max_num_seqs (say, another version) is named at start-up.
    other = dataclasses.replace(args, max_num_seqs=7, platform=None)
    env = {**os.environ, **dict(process.env), **expected_env(other)}
    server = subprocess.Popen(
        [sys.executable, "-m", "tokenspeed", "serve", *process.argv],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        warned = ""
        while time.monotonic() < deadline and not warned:
            line = server.stderr.readline()
            if not line:
                break
            if "resolved differently from the supervisor" in line:
                warned = line
        assert "max_num_seqs: supervisor 7, serve " in warned, warned
    finally:
        server.kill()
        server.wait(10)
