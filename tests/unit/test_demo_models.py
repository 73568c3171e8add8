"""The packaged demo models: present, small, loadable with transformers, and writing English."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.demo_english import FUNCTION_WORDS, corpus_share, words_of
from tokenspeed.demo_models import (
    ASSETS_DIR,
    DEMO_MODELS,
    demo_model_names,
    demo_model_path,
    resolve_model_path,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = ("The Python interpreter", "A list is", "To open a file,", "When an exception is raised")
MAX_TOTAL_BYTES = 30_000_000


@pytest.fixture(scope="module", params=demo_model_names())
def loaded(request):
    torch.set_num_threads(1)
    path = resolve_model_path(request.param)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    return request.param, model, tok


def greedy(model, tok, input_ids: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([input_ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


def test_short_names_resolve_to_packaged_folders():
    assert set(demo_model_names()) == {"demo", "demo-moe"}
    for name in demo_model_names():
        path = Path(resolve_model_path(name))
        assert path == ASSETS_DIR / name
        assert (path / "config.json").is_file()


def test_other_values_pass_through_unchanged(tmp_path):
    for value in ("./demo", str(tmp_path / "demo"), "Qwen/Qwen3-0.6B", "/models/llama", "demo2"):
        assert resolve_model_path(value) == value


def test_unknown_demo_name_is_a_clear_error():
    with pytest.raises(ValueError, match="demo-moe"):
        demo_model_path("demo-large")


def test_folders_are_complete_and_small():
    total = 0
    for model in DEMO_MODELS:
        files = {p.name: p.stat().st_size for p in model.path.iterdir()}
        for required in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ):
            assert required in files, f"{model.name} lacks {required}"
        config = json.loads((model.path / "config.json").read_text())
        assert config["architectures"] == [model.architecture]
        assert config["dtype"] == "float32"
        total += sum(files.values())
    assert total < MAX_TOTAL_BYTES, f"demo models take {total} bytes, over the {MAX_TOTAL_BYTES} budget"


def test_moe_config_has_real_experts():
    config = transformers.AutoConfig.from_pretrained(resolve_model_path("demo-moe"))
    assert config.num_experts == 8
    assert config.num_experts_per_tok == 2
    assert config.mlp_only_layers == []


def test_models_load_with_transformers(loaded):
    name, model, tok = loaded
    expected = {m.name: m.architecture for m in DEMO_MODELS}[name]
    assert type(model).__name__ == expected
    assert 2_000_000 < sum(p.numel() for p in model.parameters()) < 5_000_000
    assert tok.eos_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]


def test_greedy_continuation_is_readable_english(loaded):
    name, model, tok = loaded
    for prompt in PROMPTS:
        new = greedy(model, tok, tok(prompt)["input_ids"], max_new_tokens=24)
        text = tok.decode(new, skip_special_tokens=True)
        words = words_of(text)
        assert len(words) >= 10, f"{name}: {prompt!r} -> {text!r}"
        known = corpus_share(words)
        assert known >= 0.9, f"{name}: {prompt!r} -> {text!r} ({known:.0%} corpus words)"
        assert FUNCTION_WORDS & set(words), f"{name}: {prompt!r} -> {text!r} has no English function words"
        assert len(set(words)) >= 5, f"{name}: {prompt!r} -> {text!r} is degenerate"


def test_chat_template_renders_and_the_model_answers(loaded):
    name, model, tok = loaded
    messages = [{"role": "user", "content": "What is a dictionary?"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nWhat is a dictionary?<|im_end|>\n<|im_start|>assistant\n"
    config = json.loads((Path(resolve_model_path(name)) / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"]
    new = greedy(model, tok, tok(rendered, add_special_tokens=False)["input_ids"], max_new_tokens=120)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in new, f"{name}: the chat answer never ended: {tok.decode(new)!r}"
    answer = tok.decode(new[: new.index(im_end)])
    words = words_of(answer)
    assert len(words) >= 5 and corpus_share(words) >= 0.9, answer


def test_moe_routes_tokens_to_many_experts():
    path = resolve_model_path("demo-moe")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    text = " ".join(
        [
            "The Python interpreter reads a file, compiles it and runs the code.",
            "A list is a mutable sequence of items, and a tuple is an immutable one.",
            "When an exception is raised, the interpreter looks for a handler in the enclosing try statement.",
            "The json module encodes Python objects as strings and decodes them again.",
            "Threads share memory, while processes each have their own address space.",
        ]
    )
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        router_logits = model(ids, output_router_logits=True).router_logits
    assert len(router_logits) == 4
    for layer, logits in enumerate(router_logits):
        counts = torch.bincount(logits.topk(2, dim=-1).indices.flatten(), minlength=8)
        used = int((counts > 0).sum())
        share = float(counts.max()) / float(counts.sum())
        assert used >= 6, f"layer {layer}: only {used} experts used: {counts.tolist()}"
        assert share < 0.5, f"layer {layer}: one expert takes {share:.0%}: {counts.tolist()}"


def test_engine_greedy_matches_transformers(loaded):
    from tokenspeed import Engine

    name, model, tok = loaded
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    expected = [greedy(model, tok, ids, max_new_tokens=16) for ids in prompts]
    engine = Engine(resolve_model_path(name), device="cpu")
    try:
        results = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 16})
    finally:
        if hasattr(engine, "shutdown"):
            engine.shutdown()
    assert [r["output_ids"] for r in results] == expected
