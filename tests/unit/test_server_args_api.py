"""``ServerArgs`` beyond the rule table: environment reads, platform probing, serialisation, helpers."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tokenspeed.config.cli import prepare_server_args
from tokenspeed.config.resolve import PlatformFacts
from tokenspeed.config.server_args import ServerArgs

HOPPER = PlatformFacts("nvidia", is_hopper_or_newer=True, gpu_memory_gb=80.0)
AMPERE = PlatformFacts("nvidia", is_hopper_or_newer=False, gpu_memory_gb=80.0)
EAGLE_CONFIG = '{"method": "eagle3", "model": "draft", "num_speculative_tokens": 4}'


def resolve(argv: list[str], platform=AMPERE, model: str = "MODEL") -> ServerArgs:
    return prepare_server_args([model, *argv], platform=platform)


def test_enable_cp_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv("ENABLE_CP", "1")
    args = resolve(["--tp", "4"])
    assert (args.mapping.attn_cp_size, args.mapping.attn_tp_size, args.mapping.world_size) == (4, 1, 4)
    # Context parallelism serves one sequence at a time, so that is the default.
    assert args.max_num_seqs == 1
    monkeypatch.setenv("ENABLE_CP", "false")
    assert resolve(["--tp", "4"]).mapping.attn_tp_size == 4


def test_random_seed_drawn_when_unset():
    assert isinstance(resolve([]).seed, int)


def test_model_redirect(tmp_path, monkeypatch):
    table = tmp_path / "redirect.tsv"
    table.write_text("org/model\t/models/local\n")
    monkeypatch.setenv("TOKENSPEED_MODEL_REDIRECT_PATH", str(table))
    args = resolve([], model="org/model")
    assert (args.model, args.tokenizer) == ("/models/local", "/models/local")
    assert resolve([], model="other").model == "other"


class DuckPlatform:
    """The interface of ``tokenspeed.platform.current_platform()``."""

    def __init__(self, kind: str, hopper: bool, memory_gb: float | None):
        self.kind, self.is_hopper_or_newer, self._memory = kind, hopper, memory_gb
        self.probed = 0

    def gpu_memory_capacity_gb(self) -> float | None:
        self.probed += 1
        return self._memory


def test_platform_object_interface():
    platform = DuckPlatform("nvidia", True, 16.0)
    args = resolve(["--tp", "2"], platform=platform)
    assert (args.max_cudagraph_capture_size, args.enable_allreduce_fusion) == (8, True)
    assert platform.probed == 1


def test_cpu_device_never_probes_the_gpu():
    platform = DuckPlatform("nvidia", True, 16.0)
    resolve(["--device", "cpu"], platform=platform)
    assert platform.probed == 0


def test_real_platform_resolves_print_config_case():
    """The issue's acceptance case, on whatever machine runs the tests."""
    args = prepare_server_args(["MODEL", "--tp", "4", "--data-parallel-size", "2"])
    assert args.mapping.world_size == 8
    assert args.gpu_memory_utilization == 0.81
    json.dumps(args.to_dict())


def test_serialisable_and_resolution_is_idempotent():
    args = resolve(
        ["--tp", "4", "--speculative-config", EAGLE_CONFIG, "--eagle3-layers-to-capture", "1,2"], HOPPER
    )
    before = args.to_dict()
    json.dumps(before)
    json.dumps(dataclasses.asdict(args))
    again = dataclasses.replace(args, platform=HOPPER)
    assert again.to_dict() == before
    # a copy resolves against the facts its original was resolved against
    assert dataclasses.replace(args).to_dict() == before
    assert before["mapping"]["groups"]["attn_tp"] == [[0, 1, 2, 3]]


def test_direct_construction_resolves():
    args = ServerArgs(model="m", attn_tp_size=2, platform=HOPPER)
    assert args.mapping.world_size == 2 and args.enable_allreduce_fusion


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            [],
            {
                "TOKENSPEED_MAMBA_SSM_DTYPE": "float32",
                "TORCHINDUCTOR_ENABLE_PDL": "1",
                "TRTLLM_ENABLE_PDL": "1",
                "TLLM_LOG_LEVEL": "INFO",
            },
        ),
        (["--disable-pdl", "--mamba-ssm-dtype", "bfloat16"], {"TOKENSPEED_MAMBA_SSM_DTYPE": "bfloat16"}),
        (["--device", "cpu"], {"TOKENSPEED_MAMBA_SSM_DTYPE": "float32"}),
    ],
)
def test_environment(argv, expected):
    assert resolve(argv).environment() == expected


def test_apply_environment_keeps_explicit_pdl_setting():
    environ = {"TRTLLM_ENABLE_PDL": "0", "TOKENSPEED_MAMBA_SSM_DTYPE": "x"}
    resolve([]).apply_environment(environ)
    assert environ["TRTLLM_ENABLE_PDL"] == "0"
    assert environ["TOKENSPEED_MAMBA_SSM_DTYPE"] == "float32"
    assert environ["TORCHINDUCTOR_ENABLE_PDL"] == "1"


def test_url_brackets_ipv6():
    assert resolve(["--host", "::1", "--port", "9000"]).url() == "http://[::1]:9000"
    assert resolve([]).url() == "http://127.0.0.1:8000"


def test_mamba_cache_chunk_size():
    assert resolve(["--block-size", "16"]).mamba_cache_chunk_size == 64
    assert resolve(["--block-size", "256"]).mamba_cache_chunk_size == 256


def test_from_dict_round_trip():
    args = resolve(["--tp", "2", "--speculative-config", EAGLE_CONFIG, "--seed", "3"], HOPPER)
    data = json.loads(json.dumps(args.to_dict()))
    again = ServerArgs.from_dict(data, platform=HOPPER)
    assert again.to_dict() == args.to_dict()


def test_from_dict_unknown_field():
    with pytest.raises(ValueError, match="did you mean max_num_seqs"):
        ServerArgs.from_dict({"model": "m", "max_num_seq": 4}, platform=AMPERE)
