"""Profiles: every example validates; mistakes are named by file, line and key; servers resolve like `serve`."""

from __future__ import annotations

import pytest

from console.profile.fleet import load_and_resolve
from tests.console.conftest import tokenspeed
from tests.console.profile_files import PROFILES, error_of, write
from tokenspeed.config.cli import prepare_server_args

EXAMPLES = sorted(p for p in PROFILES.glob("*.toml") if not p.name.startswith("_"))
# Lines 1-2 of most profiles below, so the mistake they are named for is on line 3 or after.
MODEL_ONLY = '[server]\nmodel = "m"\n'


def test_examples_cover_the_gpu_deployments():
    names = {p.stem for p in EXAMPLES}
    assert {"demo", "llama-3.1-8b-h200", "qwen3-30b-a3b-ep8", "two-node-tp16"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_profile_validates(path):
    resolved = load_and_resolve(path)
    assert resolved.servers
    for spec, args in zip(resolved.servers, resolved.server_args, strict=True):
        assert args.port == spec.port and args.enable_metrics


def test_example_gpu_profiles_resolve_to_the_intended_layouts():
    llama = load_and_resolve(PROFILES / "llama-3.1-8b-h200.toml")
    assert llama.server_args[0].mapping.world_size == 1 and llama.servers[0].gpus == (0,)
    moe = load_and_resolve(PROFILES / "qwen3-30b-a3b-ep8.toml").server_args[0]
    assert (moe.mapping.world_size, moe.mapping.moe.ep_size, moe.mapping.attn.dp_size) == (8, 8, 8)
    two = load_and_resolve(PROFILES / "two-node-tp16.toml")
    args, spec = two.server_args[0], two.servers[0]
    assert (args.mapping.world_size, args.mapping.attn.tp_size, args.nnodes) == (16, 16, 2)
    assert [p.node_rank for p in spec.processes] == [0, 1]
    assert [p.node for p in spec.processes] == ["10.0.0.1", "10.0.0.2"]
    assert all(dict(p.env)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" for p in spec.processes)


def test_cli_validate_accepts_examples_and_rejects_a_typo(tmp_path):
    # The GPU examples are for other machines (their models are not here): checked alone, without the
    # pre-flight of this machine (tests/console/test_preflight.py has that).
    ok = tokenspeed("profile", "validate", "--no-preflight", *map(str, EXAMPLES))
    assert ok.returncode == 0, ok.stderr
    bad = write(tmp_path, '[server]\nmodel = "m"\natn_tp_size = 2\n')
    result = tokenspeed("profile", "validate", str(bad))
    assert result.returncode == 2
    assert (
        f"{bad}:3: [server] atn_tp_size: is not a ServerArgs field (did you mean 'attn_tp_size'?)"
        in result.stderr
    )


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        (MODEL_ONLY + "\n[fleet]\nreplica = 2\n", 5, "[fleet] replica", "did you mean 'replicas'"),
        (MODEL_ONLY + '[fleet]\nrestart = "allways"\n', 4, "[fleet] restart", "did you mean 'always'"),
        (MODEL_ONLY + '[fleet]\nreplicas = "two"\n', 4, "[fleet] replicas", "expects int"),
        (MODEL_ONLY + "[fleet.health]\nfailure = 3\n", 4, "[fleet.health] failure", "'failures'"),
        # a number outside the range its field declares (console/ranges.py)
        (
            MODEL_ONLY + "[fleet.health]\nfailures = 0\n",
            4,
            "[fleet.health] failures",
            "must be >= 1, got 0",
        ),
        (MODEL_ONLY + "[fleet.backoff]\nmultiplier = 0.5\n", 4, "[fleet.backoff] multiplier", ">= 1"),
        (
            MODEL_ONLY + "[fleet]\ndist_init_port = 80\n",
            4,
            "[fleet] dist_init_port",
            "between 1024 and 65000",
        ),
        (
            "[supervisor]\nstall_after_s = -1\n" + MODEL_ONLY,
            2,
            "[supervisor] stall_after_s",
            ">= 0 (0 turns the check off)",
        ),
        (
            MODEL_ONLY + "[console.thresholds]\nkv_usage = 1.5\n",
            4,
            "[console.thresholds] kv_usage",
            "between 0 and 1",
        ),
        (
            MODEL_ONLY + "[console.thresholds]\nttft_p99 = 1\n",
            4,
            "[console.thresholds] ttft_p99",
            "'ttft_p99_s'",
        ),
        (
            MODEL_ONLY + '[console.thresholds]\nerrors = "5"\n',
            4,
            "[console.thresholds] errors",
            "expects a number",
        ),
        (MODEL_ONLY + "port = 8000\n", 3, "[server] port", "use [fleet] base_port"),
        (MODEL_ONLY + 'dtype = "float17"\n', 3, "[server] dtype", "did you mean 'float16'"),
        (MODEL_ONLY + "block_size = 0\n", 3, "[server] block_size", "--block-size must be >= 1"),
        (MODEL_ONLY + 'enforce_eager = "yes"\n', 3, "[server] enforce_eager", "expects true or false"),
        ('[server]\ndevice = "cpu"\n', 1, "[server] model", "is required"),
        ('[sever]\nmodel = "m"\n', 1, "sever", "did you mean 'server'"),
        (MODEL_ONLY + "max_num_seqs = \n", 3, "", "not valid TOML"),
    ],
)
def test_mistakes_name_file_line_and_key(tmp_path, text, line, key, message):
    path = write(tmp_path, text)
    error = error_of(path)
    assert error.path == path.resolve()
    assert error.line == line
    assert error.key == key
    assert message in str(error)
    assert str(error).startswith(f"{path.resolve()}:{line}: " if line else f"{path.resolve()}: ")


def test_extends_merges_tables_and_blames_the_file_that_set_a_key(tmp_path):
    write(
        tmp_path,
        """\
        [server]
        device = "cpu"
        max_num_seqs = 8

        [fleet]
        restart = "always"
        base_port = 24000

        [env]
        A = "base"
        B = "base"
        """,
        "base.toml",
    )
    child = write(
        tmp_path,
        """\
        extends = "base.toml"
        [server]
        model = "m"
        max_num_seqs = 4
        [fleet]
        replicas = 2
        [env]
        B = "child"
        """,
    )
    resolved = load_and_resolve(child)
    fleet = resolved.profile.fleet
    assert (fleet.restart, fleet.replicas, fleet.base_port, fleet.name) == ("always", 2, 24000, "p")
    assert resolved.profile.env == {"A": "base", "B": "child"}
    assert resolved.server_args[0].max_num_seqs == 4 and resolved.server_args[0].device == "cpu"

    (tmp_path / "base.toml").write_text('[server]\ndevice = "cpu"\n\n[fleet]\nstop_timeout = 3\n')
    error = error_of(child)
    assert error.path == (tmp_path / "base.toml").resolve() and error.line == 5
    assert "did you mean 'stop_timeout_s'" in str(error)


def test_extends_cycle_and_missing_base(tmp_path):
    write(tmp_path, 'extends = "b.toml"\n[server]\nmodel = "m"\n', "a.toml")
    write(tmp_path, 'extends = "a.toml"\n', "b.toml")
    assert "cycle" in str(error_of(tmp_path / "a.toml"))
    missing = write(tmp_path, 'extends = "nope.toml"\n[server]\nmodel = "m"\n')
    error = error_of(missing)
    assert error.line == 1 and "does not exist" in str(error)


def test_replicas_get_ports_and_gpus_and_resolve_like_serve(tmp_path):
    path = write(
        tmp_path,
        """\
        [server]
        model = "m"
        attn_tp_size = 2
        enable_prefix_caching = false
        disable_kvstore = true
        cudagraph_capture_sizes = [1, 2, 4]
        [fleet]
        name = "pair"
        replicas = 2
        base_port = 25000
        gpus = [0, 1, 2, 3]
        [env]
        X = 1
        """,
    )
    resolved = load_and_resolve(path)
    first, second = resolved.servers
    assert (first.name, first.port, first.gpus) == ("pair-0", 25000, (0, 1))
    assert (second.name, second.port, second.gpus) == ("pair-1", 25010, (2, 3))
    assert dict(second.processes[0].env) == {"X": "1", "CUDA_VISIBLE_DEVICES": "2,3"}
    argv = list(second.processes[0].argv)
    assert "--no-enable-prefix-caching" in argv
    assert argv[
        argv.index("--cudagraph-capture-sizes") + 1 : argv.index("--cudagraph-capture-sizes") + 4
    ] == [
        "1",
        "2",
        "4",
    ]
    # The same command line through `tokenspeed serve`'s own parser gives the same ServerArgs.
    direct = prepare_server_args(argv)
    unseeded = {"seed"}  # drawn at random when not given, so it differs between any two resolutions
    mine = {k: v for k, v in resolved.server_args[1].to_dict().items() if k not in unseeded}
    assert {k: v for k, v in direct.to_dict().items() if k not in unseeded} == mine
    assert direct.enable_prefix_caching is False and direct.mapping.attn.tp_size == 2

    crowded = write(tmp_path, path.read_text().replace("replicas = 2", "replicas = 3"), "crowded.toml")
    error = error_of(crowded)
    assert error.key == "[fleet] replicas" and "do not fit" in str(error)


def test_profile_new_writes_a_profile_that_validates(tmp_path):
    target = tmp_path / "mine.toml"
    result = tokenspeed("profile", "new", str(target), "--model", "some/model", "--replicas", "2")
    assert result.returncode == 0, result.stderr
    resolved = load_and_resolve(target)
    assert len(resolved.servers) == 2 and resolved.profile.fleet.name == "mine"
    # This machine has no GPU: the only plan that can run here is a CPU one.
    assert resolved.server_args[0].device == "cpu"
    assert tokenspeed("profile", "new", str(target), "--model", "x").returncode == 2  # no overwrite


def test_profile_show_prints_each_command_line():
    result = tokenspeed("profile", "show", str(PROFILES / "two-node-tp16.toml"))
    assert result.returncode == 0, result.stderr
    assert "--node-rank 0" in result.stdout and "--node-rank 1" in result.stdout
    assert "--dist-init-addr 10.0.0.1:29500" in result.stdout
