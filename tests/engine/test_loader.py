"""Model config resolution and weight loading: formats, shards, dummy weights and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.tiny_models import (
    BASE_CONFIG,
    PagedHarness,
    hf_last_logits,
    load_hf_model,
    make_tiny_model,
    save_tiny_tokenizer,
)
from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.models.loader import load_model, weight_files
from tokenspeed.runtime.models.model_config import ModelConfig

PROMPT = [5, 17, 29, 41, 53, 65, 77]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return make_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def _copy_config(src: str, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        (dst / name).write_text((Path(src) / name).read_text())
    return dst


def _logits(path: str, load_format: str = "auto", **kwargs) -> torch.Tensor:
    config = ModelConfig.from_pretrained(path, **kwargs)
    harness = PagedHarness(load_model(config, load_format, "cpu"), config)
    return harness.step([("a", PROMPT)])[0]


def _split_state(path: str) -> list[dict[str, torch.Tensor]]:
    state = load_file(str(Path(path) / "model.safetensors"))
    names = sorted(state)
    return [{n: state[n] for n in names[i::3]} for i in range(3)]


def test_sharded_safetensors_with_index(llama, tmp_path):
    folder = _copy_config(llama, tmp_path / "sharded")
    weight_map = {}
    for i, shard in enumerate(_split_state(llama)):
        fname = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file(shard, str(folder / fname))
        weight_map.update(dict.fromkeys(shard, fname))
    # a stray file the index does not name must not be read (it would duplicate every weight)
    save_file(load_file(str(Path(llama) / "model.safetensors")), str(folder / "consolidated.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    fmt, files = weight_files(folder, "auto")
    assert fmt == "safetensors" and len(files) == 3
    ref = hf_last_logits(load_hf_model(llama), PROMPT)
    torch.testing.assert_close(_logits(str(folder)), ref, atol=1e-4, rtol=0)


def test_pt_format_sharded_bin(llama, tmp_path):
    folder = _copy_config(llama, tmp_path / "pt")
    weight_map = {}
    for i, shard in enumerate(_split_state(llama)):
        fname = f"pytorch_model-{i + 1}.bin"
        torch.save(shard, folder / fname)
        weight_map.update(dict.fromkeys(shard, fname))
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ref = _logits(llama)
    torch.testing.assert_close(_logits(str(folder), "pt"), ref, atol=0, rtol=0)
    torch.testing.assert_close(_logits(str(folder), "auto"), ref, atol=0, rtol=0)  # auto falls back to pt
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        _logits(str(folder), "safetensors")


def test_dummy_weights_are_deterministic_by_seed(llama, tmp_path):
    folder = _copy_config(llama, tmp_path / "dummy")  # no weight files at all
    config = ModelConfig.from_pretrained(str(folder))
    a = load_model(config, "dummy", "cpu", seed=1)
    b = load_model(config, "dummy", "cpu", seed=1)
    c = load_model(config, "dummy", "cpu", seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if pa.dim() > 1:
            assert not torch.equal(pa, pc), name
    logits = PagedHarness(a, config).step([("a", PROMPT)])
    assert torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="no weights in"):
        load_model(config, "auto", "cpu")


def test_missing_and_unexpected_weights_name_them(llama, tmp_path):
    state = load_file(str(Path(llama) / "model.safetensors"))
    missing = _copy_config(llama, tmp_path / "missing")
    save_file(
        {k: v for k, v in state.items() if "layers.1.self_attn.k_proj" not in k},
        str(missing / "w.safetensors"),
    )
    with pytest.raises(ValueError, match="not in the checkpoint: model.layers.1.self_attn.qkv_proj.weight"):
        _logits(str(missing))
    extra = _copy_config(llama, tmp_path / "extra")
    save_file({**state, "model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)}, str(extra / "w.safetensors"))
    with pytest.raises(ValueError, match="does not have: model.layers.9.mlp.up_proj.weight"):
        _logits(str(extra))
    wrong = _copy_config(llama, tmp_path / "wrong")
    save_file({**state, "model.norm.weight": torch.ones(3)}, str(wrong / "w.safetensors"))
    with pytest.raises(ValueError, match="'model.norm.weight' has shape \\(3,\\)"):
        _logits(str(wrong))


def test_hub_id_fails_offline_with_a_clear_message():
    with pytest.raises(ValueError, match="runs offline.*local folder"):
        ModelConfig.from_pretrained("meta-llama/Llama-3.1-8B-Instruct")


def test_config_fields_dtype_and_max_model_len(llama):
    config = ModelConfig.from_pretrained(llama)
    assert (config.architecture, config.num_layers, config.num_heads, config.num_kv_heads) == (
        "LlamaForCausalLM",
        2,
        4,
        2,
    )
    assert (config.head_dim, config.hidden_size, config.vocab_size) == (16, 64, 384)
    assert config.max_model_len == 512 and config.eos_token_ids == [2, 4]
    assert config.dtype == torch.float32 and not config.is_moe
    assert (
        ModelConfig.from_pretrained(llama, device="cuda").dtype == torch.float16
    )  # seed: fp32 -> fp16 on GPU
    assert ModelConfig.from_pretrained(llama, dtype="bfloat16").dtype == torch.bfloat16
    assert ModelConfig.from_pretrained(llama, max_model_len=100).max_model_len == 100
    with pytest.raises(ValueError, match="--max-model-len 4096 is larger than the 512"):
        ModelConfig.from_pretrained(llama, max_model_len=4096)
    with pytest.raises(ValueError, match="--dtype"):
        ModelConfig.from_pretrained(llama, dtype="int8")


def test_bfloat16_on_cpu_runs_close_to_float32(llama):
    ref = _logits(llama)
    low = _logits(llama, dtype="bfloat16")
    assert low.dtype == torch.float32
    assert (low - ref).abs().max() < 0.1 * ref.abs().max()


def test_hf_overrides_and_server_args(llama):
    args = ServerArgs(model=llama, hf_overrides='{"rope_theta": 1000.0, "max_position_embeddings": 256}')
    config = ModelConfig.from_server_args(args)
    assert config.hf_config.rope_parameters["rope_theta"] == 1000.0 and config.max_model_len == 256
    assert not torch.allclose(_logits(llama, hf_overrides='{"rope_theta": 1000.0}'), _logits(llama))
    with pytest.raises(ValueError, match="--hf-overrides must be a JSON object"):
        ModelConfig.from_pretrained(llama, hf_overrides="{rope_theta: 1}")


def test_unsupported_architecture_and_sliding_window(llama, tmp_path):
    folder = _copy_config(llama, tmp_path / "gpt")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPTNeoXForCausalLM"]}))
    with pytest.raises(ValueError, match="supported: LlamaForCausalLM"):
        ModelConfig.from_pretrained(str(folder))
    mistral = _copy_config(llama, tmp_path / "mistral")
    mcfg = {**cfg, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 64}
    (mistral / "config.json").write_text(json.dumps(mcfg))
    with pytest.raises(ValueError, match="sliding-window.*--max-model-len 64"):
        ModelConfig.from_pretrained(str(mistral))
    assert ModelConfig.from_pretrained(str(mistral), max_model_len=64).architecture == "MistralForCausalLM"


def test_mistral_style_model_matches_hf(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    vocab = save_tiny_tokenizer(tmp_path)
    config = {**BASE_CONFIG, "vocab_size": vocab, "max_position_embeddings": 256, "sliding_window": None}
    hf = MistralForCausalLM(MistralConfig(**config)).eval()
    hf.save_pretrained(str(tmp_path))
    torch.testing.assert_close(_logits(str(tmp_path)), hf_last_logits(hf, PROMPT), atol=1e-4, rtol=0)


def test_qwen3_moe_stacked_expert_checkpoint(tmp_path):
    """Checkpoints that store each layer's experts stacked ([E, 2I, H] gate|up, [E, H, I]) load the same."""
    path = make_tiny_model("qwen3_moe", tmp_path)
    state = load_file(str(Path(path) / "model.safetensors"))
    stacked = _copy_config(path, tmp_path / "stacked")
    out = {k: v for k, v in state.items() if ".experts." not in k}
    for layer in range(2):
        pre = f"model.layers.{layer}.mlp.experts"
        gate_up = [
            torch.cat([state[f"{pre}.{e}.gate_proj.weight"], state[f"{pre}.{e}.up_proj.weight"]])
            for e in range(8)
        ]
        out[f"{pre}.gate_up_proj"] = torch.stack(gate_up)
        out[f"{pre}.down_proj"] = torch.stack([state[f"{pre}.{e}.down_proj.weight"] for e in range(8)])
    save_file(out, str(stacked / "model.safetensors"))
    torch.testing.assert_close(_logits(str(stacked)), _logits(path), atol=0, rtol=0)


def test_a_servers_dummy_weights_do_not_follow_its_seed(llama, tmp_path):
    """`--seed` is drawn at random when unset; dummy weights that followed it made every start of a benchmark
    a different model (two starts on the H200 decoded different tokens from the first)."""
    from tokenspeed import Engine

    folder = _copy_config(llama, tmp_path / "dummy-engine")
    runs = []
    for seed in (1, 2):
        with Engine(model=str(folder), load_format="dummy", device="cpu", dtype="float32", seed=seed,
                    skip_tokenizer_init=True, block_size=4, max_total_tokens=256) as engine:  # fmt: skip
            out = engine.generate(
                input_ids=[PROMPT], sampling_params={"max_new_tokens": 6, "temperature": 0.0}
            )
            runs.append(out[0]["output_ids"])
    assert runs[0] == runs[1] and len(runs[0]) == 6
