"""The tuned table that sends few-token MoE steps to the GEMV (`moe/kernels/gemv_table.py`): a good file
picks per token count and shape, a malformed one fails naming the file and the key, and the environment
override and the shipped-file default behave as documented."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

pytest.importorskip("triton")

from tokenspeed.runtime.moe.kernels import gemv_table as gt  # noqa: E402
from tokenspeed.runtime.moe.kernels.gemv import MoeGemvConfig  # noqa: E402

SHAPE = gt.shape_key(128, 768, 2048, torch.bfloat16)
SMALL = MoeGemvConfig(block_n=8, down_block_h=2, down_split=2)
WIDE = MoeGemvConfig(block_n=32, block_k=128, prefetch=2)


def _write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def _good(tmp_path):
    data = gt.to_json("NVIDIA H200", {SHAPE: {1: SMALL, 4: WIDE, 16: None}}, {"date": "test"})
    return _write(tmp_path / "NVIDIA_H200.json", data), data


def test_good_file_picks_by_shape_and_token_count(tmp_path):
    path, _ = _good(tmp_path)
    table = gt.load_table(path)
    pick = lambda tokens, **kw: table.pick(  # noqa: E731
        kw.get("e", 128), kw.get("n", 768), kw.get("k", 2048), kw.get("dtype", torch.bfloat16), tokens
    )
    assert pick(1) == SMALL
    assert pick(2) == WIDE and pick(4) == WIDE  # the smallest tuned M >= T
    assert pick(8) is None and pick(16) is None  # null: the tensor-core path
    assert pick(17) is None  # past the largest tuned M
    assert pick(1, e=64) is None and pick(1, dtype=torch.float16) is None  # another shape: untuned
    assert gt.shape_key(128, 768, 2048, torch.float8_e4m3fn) == "E=128,N=768,K=2048,dtype=float8_e4m3fn"


def test_device_file_is_the_default_and_env_overrides(tmp_path):
    path, _ = _good(tmp_path)
    shipped = gt.table_for_device("NVIDIA H200", {}, tmp_path)
    assert shipped.source == path and shipped.pick(128, 768, 2048, torch.bfloat16, 1) == SMALL
    # a device without a file: every step on the tensor-core path
    assert gt.table_for_device("NVIDIA A100-SXM4-80GB", {}, tmp_path) is gt.EMPTY
    assert (
        gt.table_for_device("NVIDIA H200", {gt.ENV: "off"}, tmp_path).pick(128, 768, 2048, torch.bfloat16, 1)
        is None
    )
    forced = gt.table_for_device("NVIDIA A100", {gt.ENV: "force"}, tmp_path)
    assert forced.pick(8, 64, 32, torch.float32, gt.FORCE_MAX_TOKENS) == MoeGemvConfig()
    assert forced.pick(8, 64, 32, torch.float32, gt.FORCE_MAX_TOKENS + 1) is None
    other = _write(tmp_path / "mine.json", gt.to_json("x", {SHAPE: {2: WIDE}}, {}))
    assert (
        gt.table_for_device("NVIDIA H200", {gt.ENV: other}, tmp_path).pick(128, 768, 2048, torch.bfloat16, 1)
        == WIDE
    )


def test_shipped_tables_load():
    for path in sorted(gt.TUNED_DIR.glob("*.json")):
        assert gt.load_table(path).shapes, path


@pytest.mark.parametrize(
    "mutate, names",
    [
        (lambda d: d["shapes"][SHAPE]["1"].update(blok_n=8), ["shapes['E=128", "['1']", "blok_n"]),
        (lambda d: d["shapes"][SHAPE]["4"].update(block_n=12), ["['4']", "block_n must be a power of two"]),
        (lambda d: d["shapes"][SHAPE]["4"].update(prefetch="2"), ["['4']", "integer"]),
        (lambda d: d["shapes"][SHAPE].update({"one": None}), ["'one'", "token count"]),
        (lambda d: d["shapes"].update({"E=128,N=768": {"1": None}}), ["'E=128,N=768'", "malformed"]),
        (lambda d: d["shapes"][SHAPE].update({"8": [16, 256]}), ["['8']", "null"]),
        (lambda d: d.update(format="vllm"), ["'format'"]),
        (lambda d: d.update(shapes=[]), ["'shapes'"]),
    ],
    ids=[
        "unknown-field",
        "bad-value",
        "string-value",
        "bad-m",
        "bad-shape",
        "not-object",
        "format",
        "shapes",
    ],
)
def test_malformed_file_names_file_and_key(tmp_path, mutate, names):
    path, data = _good(tmp_path)
    mutate(data)
    _write(tmp_path / "NVIDIA_H200.json", data)
    with pytest.raises(ValueError) as err:
        gt.table_for_device("NVIDIA H200", {}, tmp_path)
    msg = str(err.value)
    assert msg.startswith(path), msg
    for name in names:
        assert name in msg, msg


def test_unreadable_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        gt.load_table(bad)
    with pytest.raises(ValueError, match=f"missing.json: no such MoE GEMV table.*{gt.ENV}"):
        gt.table_for_device("NVIDIA H200", {gt.ENV: str(tmp_path / "missing.json")}, tmp_path)


def test_written_table_round_trips(tmp_path):
    path, data = _good(tmp_path)
    assert data["shapes"][SHAPE]["1"] == asdict(SMALL) and data["shapes"][SHAPE]["16"] is None
    table = gt.load_table(path)
    assert table.shapes[SHAPE] == ((1, SMALL), (4, WIDE), (16, None))
