"""The packaged EAGLE3 draft of the `demo` model: the published EAGLE3 layout, small, and accepted often.

Acceptance is measured with the training tool's reference forward (tools/eagle3_draft.py: chains of 4
greedy drafts from every verify root, the prefix re-encoded from the target's states), against the demo
model's own greedy continuations of prompts the draft was not trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenspeed.demo_models import ASSETS_DIR, demo_model_path

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

DRAFT = ASSETS_DIR / "demo-eagle3"
TOOLS = Path(__file__).resolve().parents[2] / "tools"
MAX_BYTES = 8_000_000
PROMPTS = (
    "To open a file,",
    "When an exception is raised",
    "The weather today is",
    "If the argument is omitted,",
    "<|im_start|>user\nWhat is a dictionary?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nHow do I read a file?<|im_end|>\n<|im_start|>assistant\n",
)


def test_layout_is_eagle3():
    config = json.loads((DRAFT / "config.json").read_text())
    target = json.loads((demo_model_path("demo") / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1
    assert config["torch_dtype"] == "float32"
    for key in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        assert config[key] == target[key], key
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    h, hd = config["hidden_size"], config["head_dim"]
    nh, nkv, inter = config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]
    vocab, draft_vocab = config["vocab_size"], config["draft_vocab_size"]
    assert draft_vocab < vocab  # exercises the d2t mapping
    shapes = {
        "fc.weight": (h, 3 * h),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (nh * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (nkv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (nkv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, nh * hd),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,),
        "lm_head.weight": (draft_vocab, h),
        "d2t": (draft_vocab,),
        "t2d": (vocab,),
    }
    state = safetensors_torch.load_file(str(DRAFT / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in state.items()} == shapes  # no embed_tokens: the target's is shared
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    target_ids = torch.arange(draft_vocab) + state["d2t"]
    assert bool((target_ids[1:] > target_ids[:-1]).all()) and 0 <= int(target_ids.min())
    assert int(target_ids.max()) < vocab
    assert torch.equal(state["t2d"].nonzero().squeeze(-1), target_ids)
    assert {0, 2} <= set(target_ids.tolist())  # both EOS ids can be drafted
    assert sum(p.stat().st_size for p in DRAFT.iterdir()) < MAX_BYTES


def test_held_out_acceptance_length(monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    from demo_target import DemoTarget
    from eagle3_draft import load_draft
    from train_eagle3_draft import AUX_LAYERS, EOS_IDS, acceptance
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_model_path("demo"))
    target = DemoTarget(demo_model_path("demo"), AUX_LAYERS)
    draft = load_draft(DRAFT)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    seqs = []
    for p in prompts:  # one at a time: the same arithmetic as the engine's batch-1 greedy
        (cont,) = target.greedy([p], 48, EOS_IDS)
        seqs.append((p + cont, len(p)))
    result = acceptance(draft, target, seqs, steps=4)
    assert result["verify_steps"] > 40
    # Measured 1.90 on these prompts (2.00 over the tool's 96 held-out ones); an untrained draft scores 1.0.
    # The margin is for float rounding elsewhere flipping a near-tie argmax, not for a worse draft.
    assert result["mean_acceptance_length"] >= 1.5, result
