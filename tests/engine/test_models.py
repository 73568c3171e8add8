"""TokenSpeed models against Hugging Face transformers on tiny random float32 models (CPU).

Prefill of several prompts in one batch, decode steps, and chunked prefill mixed with decodes all run over
the real paged KV cache and the torch attention backend; every step's logits must equal the reference.
"""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import ARCHS, PagedHarness, hf_last_logits, load_hf_model, make_tiny_model
from tokenspeed.runtime.models.loader import load_model
from tokenspeed.runtime.models.model_config import ModelConfig

ATOL = 1e-4
PROMPTS = {
    "short": [11, 12, 13],
    "mid": list(range(40, 57)),
    "long": [(7 * i) % 300 + 5 for i in range(45)],
}


def _close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err = (ours - ref).abs().max().item()
    assert err < ATOL, f"{what}: max |logit diff| {err:.2e} (reference scale {ref.abs().max().item():.2f})"


def _pair(path: str):
    config = ModelConfig.from_pretrained(path)
    return config, load_model(config, "auto", "cpu"), load_hf_model(path)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    path = make_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    return (request.param, *_pair(path))


def test_prefill_batch_then_decode_matches_hf(tiny):
    arch, config, model, hf = tiny
    harness = PagedHarness(model, config)
    seqs = {rid: list(ids) for rid, ids in PROMPTS.items()}
    logits = harness.step(list(seqs.items()))
    for step in range(4):
        next_ids = []
        for i, (rid, ids) in enumerate(seqs.items()):
            ref = hf_last_logits(hf, ids)
            _close(logits[i], ref, f"{arch} {rid} step {step}")
            next_ids.append(int(ref.argmax()))
        for ids, tok in zip(seqs.values(), next_ids, strict=True):
            ids.append(tok)
        logits = harness.step([(rid, [tok]) for rid, tok in zip(seqs, next_ids, strict=True)])
    assert logits.dtype == torch.float32 and logits.shape == (len(seqs), config.vocab_size)


def test_chunked_prefill_mixed_with_decodes_matches_hf(tiny):
    arch, config, model, hf = tiny
    harness = PagedHarness(model, config)
    long, short = PROMPTS["long"], PROMPTS["short"]
    first, second = long[:20], long[20:]
    # step 1: the first chunk of `long` next to the whole prompt of `short`
    logits = harness.step([("long", first), ("short", short)])
    _close(logits[0], hf_last_logits(hf, first), f"{arch} first chunk")
    _close(logits[1], hf_last_logits(hf, short), f"{arch} short prefill")
    short_next = short + [int(logits[1].argmax())]
    # step 2: a decode, the second chunk over the cached first one, and a new one-token prompt
    logits = harness.step([("short", short_next[-1:]), ("long", second), ("one", [9])])
    _close(logits[0], hf_last_logits(hf, short_next), f"{arch} decode beside a chunk")
    _close(logits[1], hf_last_logits(hf, long), f"{arch} second chunk")
    _close(logits[2], hf_last_logits(hf, [9]), f"{arch} one-token prompt")


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("llama", {"tie_word_embeddings": True}),
        (
            "llama",
            {
                "max_position_embeddings": 1024,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                "rope_theta": 500000.0,
            },
        ),
        ("llama", {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True}),
        ("qwen3_moe", {"norm_topk_prob": False, "mlp_only_layers": [1], "num_hidden_layers": 3}),
    ],
    ids=["tied-embeddings", "llama3-rope", "mqa-bias", "moe-dense-layer-no-renorm"],
)
def test_variants_match_hf(arch, overrides, tmp_path):
    config, model, hf = _pair(make_tiny_model(arch, tmp_path, **overrides))
    if overrides.get("tie_word_embeddings"):
        assert model.lm_head.weight is model.model.embed_tokens.weight
    harness = PagedHarness(model, config)
    prompt = PROMPTS["long"] + PROMPTS["mid"]  # past original_max_position_embeddings of the llama3 case
    logits = harness.step([("a", prompt[:30])])
    logits = harness.step([("a", prompt[30:])])
    _close(logits[0], hf_last_logits(hf, prompt), f"{arch} {overrides}")


class _Recorder:
    def __init__(self):
        self.calls: list[tuple[int, torch.Tensor]] = []

    def record(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        self.calls.append((layer_id, topk_ids.clone()))


def test_moe_reports_routing_to_the_recorder(tmp_path):
    path = make_tiny_model("qwen3_moe", tmp_path, num_hidden_layers=3, mlp_only_layers=[1])
    config = ModelConfig.from_pretrained(path)
    assert config.is_moe and config.num_experts == 8 and config.num_experts_per_tok == 2
    harness = PagedHarness(load_model(config, "auto", "cpu"), config)
    recorder = _Recorder()
    harness.step([("a", [5, 6, 7, 8]), ("b", [9, 10])], expert_recorder=recorder)
    assert [layer for layer, _ in recorder.calls] == [0, 2]
    for _, ids in recorder.calls:
        assert ids.shape == (6, 2)
        assert ids.min() >= 0 and ids.max() < 8
        assert all(len(set(row)) == 2 for row in ids.tolist())  # two distinct experts per token


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_prefill_chunk_and_decode_match_hf(arch, tmp_path):
    path = make_tiny_model(arch, tmp_path)
    config = ModelConfig.from_pretrained(path, dtype="float32", device="cuda")
    model = load_model(config, "auto", "cuda")
    hf = load_hf_model(path).to("cuda")
    harness = PagedHarness(model, config, device="cuda")
    long, short = PROMPTS["long"], PROMPTS["short"]
    logits = harness.step([("long", long[:20]), ("short", short)]).cpu()
    _close(logits[1], hf_last_logits(hf, short).cpu(), f"{arch} gpu prefill")
    nxt = short + [int(logits[1].argmax())]
    logits = harness.step([("short", nxt[-1:]), ("long", long[20:])]).cpu()
    _close(logits[0], hf_last_logits(hf, nxt).cpu(), f"{arch} gpu decode")
    _close(logits[1], hf_last_logits(hf, long).cpu(), f"{arch} gpu chunk")
