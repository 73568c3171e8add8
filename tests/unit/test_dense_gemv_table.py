"""The dense GEMV's tuned table (kernels/gemv_table.py): what `benchmarks/bf16_gemv.py --table-out` derives
from a run, what the server reads back, and the errors a malformed table gets."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tokenspeed.runtime.kernels.gemv_table import (
    FORMAT,
    DenseGemvTable,
    load_table,
    shape_key,
    table_for_device,
)

ROOT = Path(__file__).resolve().parents[2]
H200_RUN = ROOT / "benchmarks" / "results" / "gpu_bf16_gemv.json"
QWEN3_MOE_RUN = ROOT / "benchmarks" / "results" / "gpu_bf16_gemv_qwen3moe.json"
SHIPPED_H200 = ROOT / "tokenspeed" / "runtime" / "kernels" / "tuned" / "NVIDIA_H200.json"


def _bf16_gemv_script():
    spec = importlib.util.spec_from_file_location("bf16_gemv_bench", ROOT / "benchmarks" / "bf16_gemv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_h200_run_gives_the_gemv_only_where_it_won():
    # gpu_bf16_gemv.json (H200, 2026-12-04 12:57 UTC): qkv 1.02x at 1 row (under the 3% margin) and 0.96x at
    # 2; o won at 1 and 2 (1.12x, 1.15x); down won at 1 and 2 (1.08x, 1.07x); the LM head won at 1 (1.06x)
    # and tied at 2; gate_up lost at 1 (0.92x); every shape lost at 4 rows.
    rows = json.loads(H200_RUN.read_text())["rows"]
    table = _bf16_gemv_script().table_rows(rows)
    assert table == {
        shape_key(6144, 4096, "bfloat16"): 0,
        shape_key(4096, 4096, "bfloat16"): 2,
        shape_key(28672, 4096, "bfloat16"): 0,
        shape_key(4096, 14336, "bfloat16"): 2,
        shape_key(128256, 4096, "bfloat16"): 1,
    }
    # ... and the table the package ships for the H200 is the one `--table-from` derives from that run and the
    # Qwen3-30B-A3B run: their verdicts, and the configuration that won each batch the GEMV takes
    script = _bf16_gemv_script()
    qwen_rows = json.loads(QWEN3_MOE_RUN.read_text())["rows"]
    qwen_table = script.table_rows(qwen_rows)
    shipped = json.loads(SHIPPED_H200.read_text())
    assert shipped["shapes"] == {**table, **qwen_table}
    assert shipped["configs"] == {**script.table_configs(rows, table), **script.table_configs(qwen_rows, qwen_table)}
    assert shipped["provenance"]["script"] == "benchmarks/bf16_gemv.py"
    assert shipped["provenance"]["argv"][:3] == ["--table-from", str(H200_RUN.relative_to(ROOT)), str(QWEN3_MOE_RUN.relative_to(ROOT))]


def test_the_shipped_table_names_a_configuration_for_every_batch_the_gemv_takes():
    # so no server autotunes the shapes the table gives the GEMV: every process launches the same kernels
    from tokenspeed.runtime.kernels.bf16_gemv import DenseGemvConfig, fits, m_bucket

    table = load_table(SHIPPED_H200)
    bf16 = torch.bfloat16
    for key, rows in table.max_rows.items():
        n, k = (int(part.split("=")[1]) for part in key.split(",")[:2])
        for m in range(1, rows + 1):
            cfg = table.config_for(n, k, bf16, m_bucket(m))
            assert cfg is not None, (key, m)
            assert fits(DenseGemvConfig.from_table(cfg), m_bucket(m)), (key, m)
    # the 8B down projection at one row: the configuration the H200 run's autotuner chose (gpu_bf16_gemv.json)
    assert dict(table.config_for(4096, 14336, bf16, 1)) == {
        "BLOCK_N": 4, "BLOCK_K": 512, "SPLIT_K": 1, "PREFETCH": 1, "num_warps": 4, "num_stages": 1,
    }  # fmt: skip


def test_the_layer_launches_the_shipped_configuration(tmp_path):
    from tokenspeed.runtime.kernels.bf16_gemv import DenseGemvConfig
    from tokenspeed.runtime.layers.dense_gemv import TritonGemv

    shipped = load_table(SHIPPED_H200)
    gemv = TritonGemv(shipped)
    w = torch.empty(2048, 4096, dtype=torch.bfloat16)  # Qwen3-30B-A3B's o_proj
    for m in (1, 2, 3, 4):
        x = torch.empty(m, 4096, dtype=torch.bfloat16)
        bucket = 1 if m == 1 else 2 if m == 2 else 4
        assert gemv._config(x, w) == DenseGemvConfig.from_table(shipped.config_for(2048, 4096, torch.bfloat16, bucket))
    # a shape the table gives no configuration: the autotuner picks (None)
    assert gemv._config(torch.empty(1, 64, dtype=torch.bfloat16), torch.empty(32, 64, dtype=torch.bfloat16)) is None
    # a configuration whose accumulators cannot fit the bucket is not launched: autotuned instead
    big = {"BLOCK_N": 16, "BLOCK_K": 1024, "SPLIT_K": 1, "PREFETCH": 1, "num_warps": 4, "num_stages": 1}
    path = tmp_path / "NVIDIA_H200.json"
    key = shape_key(32, 64, "bfloat16")
    path.write_text(json.dumps({"format": FORMAT, "shapes": {key: 4}, "configs": {key: {"4": big}}}))
    assert TritonGemv(load_table(path))._config(torch.empty(4, 64, dtype=torch.bfloat16), torch.empty(32, 64, dtype=torch.bfloat16)) is None


def test_the_qwen3_moe_run_gives_the_gemv_its_small_products():
    # gpu_bf16_gemv_qwen3moe.json (H200, 2026-12-04 15:59 UTC): o 1.29x / 1.34x / 1.09x at 1 / 2 / 4 rows, the
    # router 2.06x / 1.94x / 1.57x, qkv 1.04x at 1 and 0.93x at 2, the LM head 1.04x at 1 and 1.00x at 2
    table = _bf16_gemv_script().table_rows(json.loads(QWEN3_MOE_RUN.read_text())["rows"])
    assert table == {
        shape_key(5120, 2048, "bfloat16"): 1,
        shape_key(2048, 4096, "bfloat16"): 4,
        shape_key(128, 2048, "bfloat16"): 4,
        shape_key(151936, 2048, "bfloat16"): 1,
    }


def test_written_table_is_read_back_and_decides_per_shape_and_batch(tmp_path):
    path = tmp_path / "NVIDIA_H200.json"
    rows = json.loads(H200_RUN.read_text())["rows"]
    script = _bf16_gemv_script()
    script.write_table(str(path), "NVIDIA H200", script.table_rows(rows))
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["device"] == "NVIDIA H200"
    assert data["provenance"]["script"] and data["provenance"]["time"]  # the running script (pytest here)
    table = table_for_device("NVIDIA H200", directory=tmp_path)
    assert table and table.source == str(path)
    bf16 = torch.bfloat16
    assert table.takes(128256, 4096, bf16, 1) and not table.takes(128256, 4096, bf16, 2)
    assert table.takes(4096, 14336, bf16, 2) and not table.takes(4096, 14336, bf16, 4)
    assert not table.takes(28672, 4096, bf16, 1)  # gate_up stays on cuBLAS
    assert not table.takes(6144, 4096, bf16, 1)  # qkv: a win under the margin
    assert not table.takes(6144, 4096, torch.float16, 1)  # a dtype the run did not time
    assert not table.takes(1000, 4096, bf16, 1)  # a shape the table does not name
    # a device without a shipped table: cuBLAS everywhere
    assert not table_for_device("NVIDIA A100-SXM4-80GB", directory=tmp_path)
    assert not DenseGemvTable()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        (json.dumps({"format": "other/1", "shapes": {}}), "'format': 'tokenspeed-dense-gemv/1'"),
        (json.dumps({"format": FORMAT, "shapes": []}), "'shapes' must be an object"),
        (json.dumps({"format": FORMAT, "shapes": {"6144x4096": 1}}), "shape key '6144x4096' is malformed"),
        (json.dumps({"format": FORMAT, "shapes": {"N=1,K=2,dtype=bfloat16": -1}}), "rows >= 0"),
        (json.dumps({"format": FORMAT, "shapes": {"N=1,K=2,dtype=bfloat16": True}}), "rows >= 0"),
        (json.dumps({"format": FORMAT, "shapes": {"N=1,K=2,dtype=bfloat16": "2"}}), "rows >= 0"),
        (json.dumps({"format": FORMAT, "shapes": {}, "configs": []}), "'configs' must be an object"),
        (json.dumps({"format": FORMAT, "shapes": {}, "configs": {"N=1,K=2,dtype=bfloat16": {}}}), "not in 'shapes'"),
        (
            json.dumps({"format": FORMAT, "shapes": {"N=1,K=2,dtype=bfloat16": 1}, "configs": {"N=1,K=2,dtype=bfloat16": {"3": {}}}}),
            r"must map batch buckets \['1', '2', '4'\]",
        ),
        (
            json.dumps({"format": FORMAT, "shapes": {"N=1,K=2,dtype=bfloat16": 1}, "configs": {"N=1,K=2,dtype=bfloat16": {"1": {"BLOCK_N": 4}}}}),
            "must be an object with exactly",
        ),
        (
            json.dumps({"format": FORMAT, "shapes": {"N=1,K=2,dtype=bfloat16": 1}, "configs": {"N=1,K=2,dtype=bfloat16": {"1": {
                "BLOCK_N": 4, "BLOCK_K": 512, "SPLIT_K": 0, "PREFETCH": 1, "num_warps": 4, "num_stages": 1}}}}),
            r"\['SPLIT_K'\] must be an integer >= 1",
        ),
    ],
)
def test_a_malformed_table_names_the_file_and_the_problem(tmp_path, content, message):
    path = tmp_path / "NVIDIA_H200.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        load_table(path)
    assert str(path) in str(err.value)


def test_a_second_models_table_keeps_the_first_models_shapes(tmp_path):
    # `--model qwen3moe --table-base <the 8B table>`: one file serves both models; this run's verdicts win
    base, out = tmp_path / "base.json", tmp_path / "NVIDIA_H200.json"
    script = _bf16_gemv_script()
    script.write_table(str(base), "NVIDIA H200", script.table_rows(json.loads(H200_RUN.read_text())["rows"]))
    qwen = {shape_key(5120, 2048, "bfloat16"): 1, shape_key(4096, 4096, "bfloat16"): 0}
    script.write_table(str(out), "NVIDIA H200", qwen, str(base))
    table = table_for_device("NVIDIA H200", directory=tmp_path)
    bf16 = torch.bfloat16
    assert table.takes(5120, 2048, bf16, 1) and not table.takes(5120, 2048, bf16, 2)
    assert table.takes(128256, 4096, bf16, 1)  # kept from the base
    assert not table.takes(4096, 4096, bf16, 1)  # this run's verdict replaced the base's 2
