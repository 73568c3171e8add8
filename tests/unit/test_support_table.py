"""The support table covers every ServerArgs field, and what it refuses is refused by `tokenspeed serve`
itself (the real parser, resolution and entry point), naming the flag, before anything starts."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenspeed.config.cli import field_argv
from tokenspeed.config.flags import FIELD_CHOICES
from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.support import IMPLEMENTED, NO_EFFECT, REFUSED, SUPPORT, UNTESTED
from tokenspeed.config.support_check import assess, no_effect_warning
from tokenspeed.runtime.entrypoints import serve

TESTS = Path(__file__).resolve().parents[1]
FIELDS = {f.name: f for f in dataclasses.fields(ServerArgs)}
# Refused fields whose non-default value must have a particular shape to get past the parser.
REFUSED_VALUES = {
    "speculative_config": '{"method": "eagle3", "model": "d"}',
    "eagle3_layers_to_capture": "1,2",
    "kvstore_storage_backend_extra_config": "{}",
    "speculative_eagle_topk": 2,
}
NO_FLAG = {"enable_inline_detokenizer", "enable_kvstore"}


def test_every_field_has_an_entry():
    assert set(FIELDS) - set(SUPPORT) == set(), "add these ServerArgs fields to config/support.py"
    assert set(SUPPORT) - set(FIELDS) == set(), "config/support.py lists fields ServerArgs does not have"


@pytest.mark.parametrize("name", sorted(n for n, s in SUPPORT.items() if s.status == IMPLEMENTED))
def test_implemented_entry_names_a_test_file(name):
    note = SUPPORT[name].note
    assert note == UNTESTED or (TESTS / note).is_file(), f"{name}: {note} is not a test file"


@pytest.mark.parametrize("name", sorted(n for n, s in SUPPORT.items() if s.status != IMPLEMENTED))
def test_other_entries_say_why(name):
    support = SUPPORT[name]
    assert support.note and support.values is None
    assert support.status in (REFUSED, NO_EFFECT)
    assert support.status == NO_EFFECT or support.instead


def test_implemented_values_are_the_registries():
    from tokenspeed.runtime.engine import tokenizer
    from tokenspeed.runtime.layers import dense_gemv
    from tokenspeed.runtime.layers.attention import attention_backend_registry
    from tokenspeed.runtime.layers.sampling import SAMPLING_BACKENDS
    from tokenspeed.runtime.models.loader import LOAD_FORMATS
    from tokenspeed.runtime.moe import backend as moe
    from tokenspeed.runtime.moe.eplb_algorithm import ALGORITHMS
    from tokenspeed.runtime.moe.expert_location import DISPATCH_ALGORITHMS
    from tokenspeed.runtime.moe.expert_parallel import ALL2ALL_BACKENDS

    def values(name):
        return {v for v in SUPPORT[name].values if v is not None}

    assert values("attention_backend") == set(attention_backend_registry().names())
    assert values("sampling_backend") == set(SAMPLING_BACKENDS)
    assert values("moe_backend") == set(moe.CHOICES)
    assert values("dense_gemv_backend") == set(dense_gemv.CHOICES)
    assert values("load_format") == set(LOAD_FORMATS)
    assert values("all2all_backend") == set(ALL2ALL_BACKENDS)
    assert values("ep_dispatch_algorithm") == set(DISPATCH_ALGORITHMS)
    assert values("eplb_algorithm") == set(ALGORITHMS)
    assert values("tokenizer_mode") == set(tokenizer._SUPPORTED_MODES)


def _non_default(name: str):
    if name in REFUSED_VALUES:
        return REFUSED_VALUES[name]
    default = FIELDS[name].default
    choices = [c for c in FIELD_CHOICES.get(name, ()) if c != default]
    if choices:
        return choices[0]
    text = str(FIELDS[name].type)  # the annotation as written (postponed annotations)
    if "bool" in text:
        return not default
    if "int" in text:
        return (default or 0) + 3
    if "float" in text:
        return (default or 0.0) + 0.5
    return "x"


def _serve_error(argv: list[str], capsys) -> tuple[int, str]:
    # --print-config: a setting the check would let through prints and exits 0 instead of starting a server
    try:
        code = serve.main(["demo", "--device", "cpu", *argv, "--print-config"])
    except SystemExit as exc:  # the parser's own refusal of a value outside the seed's choices
        code = exc.code
    return code, capsys.readouterr().err


def _seed_values_not_built() -> list[tuple[str, object]]:
    out = []
    for name, support in SUPPORT.items():
        if support.values is None:
            continue
        out += [(name, v) for v in FIELD_CHOICES.get(name, ()) if v not in support.values]
    return out


@pytest.mark.parametrize("name", sorted(n for n, s in SUPPORT.items() if s.status == REFUSED))
def test_refused_field_stops_serve_naming_its_flag(name, capsys):
    value = _non_default(name)
    if name in NO_FLAG:
        with pytest.raises(ValueError, match=name):
            from console.profile.server import _resolve

            _resolve({"model": "demo", "device": "cuda", name: value}, None)
        return
    argv = field_argv(name, value)
    code, err = _serve_error(argv, capsys)
    assert code == serve.EXIT_USAGE, f"{argv} was not refused"
    assert argv[0] in err and "Traceback" not in err, err


@pytest.mark.parametrize(("name", "value"), _seed_values_not_built())
def test_seed_choice_not_built_is_refused(name, value, capsys):
    argv = field_argv(name, value)
    code, err = _serve_error(argv, capsys)
    assert code == serve.EXIT_USAGE and argv[0] in err, err


def test_no_effect_flags_print_their_status_and_one_warning_line(capsys):
    code = serve.main(["demo", "--device", "cpu", "--disable-tf32", "--enable-nvtx", "--print-config"])
    out = json.loads(capsys.readouterr().out)
    assert code == serve.EXIT_OK
    assert out["support"]["disable_tf32"] == NO_EFFECT and out["support"]["enable_nvtx"] == NO_EFFECT
    assert out["support"]["max_num_seqs"] == IMPLEMENTED
    args = serve.parse_args(["demo", "--device", "cpu", "--disable-tf32", "--enable-nvtx"])[0]
    line = no_effect_warning(assess(args))
    assert line is not None and "--disable-tf32" in line and "--enable-nvtx" in line and "\n" not in line


def test_values_resolution_derives_are_not_taken_for_settings():
    # A GPU server's resolution turns fusion on and the CPU turns prefill graphs off by themselves.
    from tokenspeed.config.resolve import PlatformFacts

    hopper = PlatformFacts(kind="nvidia", is_hopper_or_newer=True, gpu_memory_gb=140.0)
    args = ServerArgs(model="m", attn_tp_size=2, platform=hopper)
    assert args.enable_allreduce_fusion
    assert assess(args).no_effect == {} and assess(args).refused == {}
    assert assess(ServerArgs(model="m", device="cpu")).no_effect == {}


def test_speculative_settings_halve_the_batch_and_graph_sizes_as_the_seed_does():
    plain = ServerArgs(model="m", device="cpu")
    spec = ServerArgs(
        model="m", device="cpu", speculative_algorithm="EAGLE3", speculative_draft_model_path="d"
    )
    assert (plain.max_num_seqs, plain.max_cudagraph_capture_size) == (160, 160)
    assert (spec.max_num_seqs, spec.max_cudagraph_capture_size) == (80, 80)
    assert set(assess(spec).refused) == {"speculative_draft_model_path"}  # "d" holds no draft
    mtp = ServerArgs(model="m", device="cpu", speculative_algorithm="MTP")
    assert set(assess(mtp).refused) == {"speculative_algorithm", "draft_model_path_use_base"}


@pytest.mark.parametrize(
    "argv",
    [
        ["--moe-backend", "bogus"],
        ["--speculative-algorithm", "MTP"],
        ["--kvstore-ratio", "3"],
    ],
    ids=["moe-backend", "mtp", "kvstore"],
)
def test_refusal_is_fast_and_has_no_traceback(argv):
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tokenspeed", "serve", "demo", "--device", "cpu", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert argv[0] in proc.stderr and "Traceback" not in proc.stderr
    # measured ~0.4 s idle; the bound leaves room for a loaded 2-core CI machine
    assert elapsed < 4.0, f"refusal took {elapsed:.1f}s"


# The start-up examples of issue 16, each now an error naming the flag or a listed no-effect flag.
ISSUE_EXAMPLES = [
    (["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/missing"], REFUSED),
    (["--kvstore-ratio", "4"], REFUSED),
    (["--kvstore-storage-backend", "mooncake"], REFUSED),
    (["--reasoning-parser", "bogus-parser"], REFUSED),
    (["--quantization", "mxfp4"], REFUSED),
    (["--quantization", "w8a8_fp8"], REFUSED),
    (["--kv-cache-quant-method", "per_token_head"], REFUSED),
    # KV scales without an FP8 KV cache, or a file that is not there: an error naming the flag
    (["--quantization-param-path", "/missing/scales.json"], REFUSED),
    (["--quantization-param-path", "/missing/scales.json", "--kv-cache-dtype", "fp8"], REFUSED),
    (["--disaggregation-mode", "prefill"], REFUSED),
    (["--disaggregation-mode", "decode"], REFUSED),
    (["--pdlb-url", "http://127.0.0.1:9"], REFUSED),
    (["--ext-yaml", "/missing/model.yaml"], REFUSED),
    (["--moe-backend", "bogus"], REFUSED),
    # a misspelt key would be dropped when requests are built: refused at start-up instead
    (["--preferred-sampling-params", '{"max_tokens": 5}'], REFUSED),
    (["--deepep-mode", "normal"], NO_EFFECT),
    (["--enable-memory-saver"], NO_EFFECT),
    (["--disable-tf32"], NO_EFFECT),
    (["--delete-ckpt-after-loading"], NO_EFFECT),
    (["--weight-loader-prefetch-checkpoints"], NO_EFFECT),
    (["--prefill-graph-max-tokens", "512"], NO_EFFECT),
    (["--enable-allreduce-fusion"], NO_EFFECT),
    (["--disable-pdl"], NO_EFFECT),
    (["--download-dir", "/tmp/hf"], NO_EFFECT),
]


@pytest.mark.parametrize(("argv", "status"), ISSUE_EXAMPLES, ids=[" ".join(a) for a, _ in ISSUE_EXAMPLES])
def test_issue_examples(argv, status, capsys):
    code, err = _serve_error(argv, capsys)
    if status == REFUSED:
        assert code == serve.EXIT_USAGE and argv[0] in err and "Traceback" not in err, err
        return
    assert code == serve.EXIT_OK, err
    args = serve.parse_args(["demo", "--device", "cpu", *argv])[0]
    assert argv[0] in no_effect_warning(assess(args))


def test_offline_engine_refuses_before_loading_anything():
    from tokenspeed.runtime.entrypoints.offline import Engine

    started = time.monotonic()
    with pytest.raises(ValueError, match="--speculative-algorithm EAGLE3"):
        Engine(model="demo", device="cpu", speculative_algorithm="EAGLE3", speculative_draft_model_path="d")
    assert time.monotonic() - started < 5.0  # no weights were read
