"""Server groups in one fleet (`[groups.NAME]`) and the `[load]` table: resolution, names, ports, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.profile.fleet import ProfileError, load_and_resolve, load_profile
from console.profile.toml import read_profile
from console.supervisor.load import LoadSpec, parse_load
from tests.console.conftest import tokenspeed
from tests.console.profile_files import PROFILES, error_of, write

TWO_GROUPS = """\
    [server]
    device = "cpu"
    max_num_seqs = 8

    [groups.dense]
    model = "demo"
    replicas = 2

    [groups.moe]
    model = "demo-moe"
    max_num_seqs = 2
    enable_expert_distribution_metrics = true
    expert_distribution_recorder_mode = "stat"

    [fleet]
    name = "mix"
    base_port = 31000
    replicas = 1
    """


def test_groups_name_servers_continue_ports_and_override_server(tmp_path):
    resolved = load_and_resolve(write(tmp_path, TWO_GROUPS))
    names = [s.name for s in resolved.servers]
    assert names == ["mix-dense-0", "mix-dense-1", "mix-moe-0"]
    assert [s.port for s in resolved.servers] == [31000, 31010, 31020]
    dense, _, moe = resolved.server_args
    assert Path(dense.model).name == "demo" and Path(moe.model).name == "demo-moe"
    # Group keys override [server]; [server] keys reach every group; [fleet] replicas is the default count.
    assert (dense.max_num_seqs, moe.max_num_seqs) == (8, 2)
    assert dense.device == moe.device == "cpu"
    assert moe.enable_expert_distribution_metrics and not dense.enable_expert_distribution_metrics
    for spec, args in zip(resolved.servers, resolved.server_args, strict=True):
        assert args.port == spec.port and args.enable_metrics
        assert f"--port {spec.port}" in " ".join(spec.processes[0].argv)


def test_port_stride_and_explicit_gpus_split_between_groups(tmp_path):
    path = write(
        tmp_path,
        """\
        [server]
        model = "demo"
        [groups.a]
        replicas = 2
        [groups.b]
        replicas = 1
        [fleet]
        name = "g"
        base_port = 32000
        port_stride = 5
        gpus = [0, 1, 2, 3]
        """,
    )
    resolved = load_and_resolve(path)
    assert [(s.name, s.port, s.gpus) for s in resolved.servers] == [
        ("g-a-0", 32000, (0,)),
        ("g-a-1", 32005, (1,)),
        ("g-b-0", 32010, (2,)),
    ]


def test_without_groups_names_and_ports_are_unchanged(tmp_path):
    path = write(
        tmp_path, '[server]\nmodel = "demo"\ndevice = "cpu"\n[fleet]\nname = "plain"\nreplicas = 2\n'
    )
    resolved = load_and_resolve(path)
    assert [(s.name, s.port) for s in resolved.servers] == [("plain-0", 30000), ("plain-1", 30010)]


def test_demo_profile_runs_both_models_with_metrics_and_load():
    resolved = load_and_resolve(PROFILES / "demo.toml")
    assert [s.name for s in resolved.servers] == ["demo-dense-0", "demo-dense-1", "demo-moe-0"]
    models = [Path(a.model).name for a in resolved.server_args]
    assert models == ["demo", "demo", "demo-moe"]
    assert all(a.device == "cpu" and a.enable_metrics for a in resolved.server_args)
    assert resolved.server_args[2].enable_expert_distribution_metrics
    assert parse_load(read_profile(PROFILES / "demo.toml")) is not None


def test_a_typo_in_a_group_names_the_group_and_line_with_a_suggestion(tmp_path):
    path = write(tmp_path, TWO_GROUPS.replace("max_num_seqs = 2", "max_num_seq = 2"))
    error = error_of(path)
    assert error.key == "[groups.moe] max_num_seq"
    assert error.line == 11 and "did you mean 'max_num_seqs'" in str(error)


def test_a_bad_value_in_a_group_is_blamed_on_the_group(tmp_path):
    path = write(
        tmp_path,
        TWO_GROUPS.replace(
            'expert_distribution_recorder_mode = "stat"', 'expert_distribution_recorder_mode = "stats"'
        ),
    )
    error = error_of(path)
    assert error.key == "[groups.moe] expert_distribution_recorder_mode", str(error)


@pytest.mark.parametrize(
    ("snippet", "key", "words"),
    [
        ("replicas = 0", "[groups.dense] replicas", "at least 1"),
        ('replicas = "2"', "[groups.dense] replicas", "integer"),
        ("port = 9000", "[groups.dense] port", "[fleet] base_port"),
    ],
)
def test_group_replicas_and_fleet_owned_keys_are_checked(tmp_path, snippet, key, words):
    path = write(tmp_path, TWO_GROUPS.replace("replicas = 2", snippet))
    error = error_of(path)
    assert error.key == key and words in str(error).replace(">= 1", "at least 1"), str(error)


def test_a_group_must_be_a_table(tmp_path):
    path = write(tmp_path, '[server]\nmodel = "demo"\n[groups]\ndense = 2\n')
    assert "must be a table: [groups.dense]" in str(error_of(path))


SERVER = '[server]\nmodel = "demo"\ndevice = "cpu"\n'


@pytest.mark.parametrize(
    ("text", "key", "got"),
    [
        (
            SERVER + "[[load]]\nrate_per_s = 1\n[[load]]\nrate_per_s = 2\n",
            "load",
            "[[load]] (a list of 2 tables)",
        ),
        ('fleet = "x"\n' + SERVER, "fleet", "'x'"),
        (SERVER + '[[groups]]\nmodel = "demo"\n', "groups", "[[groups]] (a list of 1 table)"),
    ],
    ids=["load", "fleet", "groups"],
)
def test_a_top_level_key_that_is_not_a_table_is_named_at_its_line(tmp_path, text, key, got):
    error = error_of(write(tmp_path, text))
    assert error.key == key and error.line is not None, (error.key, error.line)
    assert f"must be a table: [{key}]" in str(error) and f"got {got}" in str(error), str(error)


def test_a_group_without_a_model_anywhere_is_refused(tmp_path):
    path = write(tmp_path, '[server]\ndevice = "cpu"\n[groups.a]\nreplicas = 1\n')
    assert "model" in error_of(path).key


def test_load_table_is_parsed_and_checked(tmp_path):
    good = write(tmp_path, '[server]\nmodel = "demo"\n[load]\nrate_per_s = 2\nmax_tokens = 16\n')
    load_profile(good)
    assert parse_load(read_profile(good)) == LoadSpec(rate_per_s=2.0, max_tokens=16)
    assert parse_load(read_profile(write(tmp_path, '[server]\nmodel = "demo"\n', "none.toml"))) is None
    for text, key, words in [
        ("rate_per_sec = 1", "[load] rate_per_sec", "did you mean 'rate_per_s'"),
        ("concurrency = 0", "[load] concurrency", "between 1"),
        ("max_tokens = 1.5", "[load] max_tokens", "an integer"),
        ('chat_fraction = "x"', "[load] chat_fraction", "a number"),
    ]:
        bad = write(tmp_path, f'[server]\nmodel = "demo"\n[load]\n{text}\n', "bad.toml")
        with pytest.raises(ProfileError) as info:
            load_profile(bad)
        assert info.value.key == key and words in str(info.value) and info.value.line == 4, str(info.value)


def test_cli_show_lists_every_group_server(tmp_path):
    result = tokenspeed("profile", "show", str(write(tmp_path, TWO_GROUPS)))
    assert result.returncode == 0, result.stderr
    for name, port in (("mix-dense-0", 31000), ("mix-dense-1", 31010), ("mix-moe-0", 31020)):
        assert name in result.stdout and f"--port {port}" in result.stdout
