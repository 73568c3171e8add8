"""Tiny random Hugging Face models for tests: a saved folder with config, safetensors and a tokenizer.

Weights use `initializer_range` 0.25 (not the default 0.02) so greedy choices are far from near-ties that
float rounding could flip. The tokenizer is a byte-level BPE trained in code on a small corpus (nothing is
downloaded); it is built once per process and copied into every folder.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import torch

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe")

SPECIAL_TOKENS = ["<|pad|>", "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
PAD_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = range(len(SPECIAL_TOKENS))

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I am fine, thank you.",
    "TokenSpeed serves large language models with paged attention and a radix prefix cache.",
    "Once upon a time there was a little model that predicted the next token.",
    "def add(a, b):\n    return a + b\n",
    "The capital of France is Paris. The capital of Italy is Rome.",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "She sells sea shells by the sea shore; the shells she sells are surely sea shells.",
    "In the beginning the scheduler admits requests, then prefill chunks and decodes share each step.",
    "user assistant system: you are a helpful assistant. Answer briefly and clearly.",
]

# The fields every tiny model shares, whatever its architecture (a test may build its own class from them).
BASE_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    initializer_range=0.25,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
)

_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(rope_theta=10000.0),
    "qwen2": dict(rope_theta=10000.0, num_hidden_layers=3),
    "qwen3": dict(rope_theta=10000.0, num_hidden_layers=3),
    "qwen3_moe": dict(
        rope_theta=10000.0,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
}


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok.to_str()


def save_tiny_tokenizer(path: str | os.PathLike) -> int:
    """Write the test tokenizer into `path`; returns its vocabulary size (special tokens included)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[PAD_ID],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(path))
    return len(tokenizer)


def tiny_hf_config(arch: str, vocab_size: int, **overrides):
    """The transformers config of a tiny model of `arch` (see ARCHS)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "qwen3_moe": Qwen3MoeConfig}
    if arch not in classes:
        raise ValueError(f"unknown tiny model arch {arch!r}; choose one of {ARCHS}")
    kwargs: dict[str, Any] = {**BASE_CONFIG, **_ARCH_DEFAULTS[arch], "vocab_size": vocab_size, **overrides}
    config = classes[arch](**kwargs)
    config.architectures = [config.__class__.__name__.replace("Config", "ForCausalLM")]
    return config


def make_tiny_model(arch: str, tmp_path: str | os.PathLike, seed: int = 0, **overrides) -> str:
    """Save a tiny float32 random model of `arch` under `tmp_path`; returns the folder path.

    `overrides` are config fields (e.g. `num_hidden_layers=4`, `tie_word_embeddings=True`).
    The generation config lists both `<|end_of_text|>` and `<|im_end|>` as EOS, like chat models do.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(tmp_path) / f"tiny-{arch}"
    suffix = 1
    while out.exists():
        suffix += 1
        out = Path(tmp_path) / f"tiny-{arch}-{suffix}"
    out.mkdir(parents=True)
    vocab_size = save_tiny_tokenizer(out)
    config = tiny_hf_config(arch, vocab_size, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    model.save_pretrained(str(out))
    GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=[EOS_ID, IM_END_ID], pad_token_id=PAD_ID, do_sample=False
    ).save_pretrained(str(out))
    return str(out)


def load_hf_model(path: str):
    """The transformers reference model of a saved tiny folder (float32, eval mode, eager attention)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def read_config(path: str) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


class PagedHarness:
    """Runs a TokenSpeed model step by step over a real paged KV pool, without the scheduler.

    Each request gets a row of `req_to_token`; new tokens take the next free slots in arrival order, so
    requests stepped together interleave in the pool (their slots are not contiguous).
    `step([(rid, new_token_ids), ...])` returns float32 logits [B, vocab] of each request's last new token.
    """

    def __init__(
        self,
        model,
        model_config,
        backend: str = "torch",
        device: str = "cpu",
        num_pages: int = 64,
        block_size: int = 16,
        max_reqs: int = 16,
        kv_dtype: torch.dtype | None = None,
        kv_scales: tuple[list[float], list[float]] | None = None,
    ):
        from tokenspeed.runtime.cache.kv_pool import KVPool, KVPoolSpec
        from tokenspeed.runtime.layers.attention import create_attention_backend

        self.model = model
        self.device = torch.device(device)
        spec = KVPoolSpec(
            model_config.num_layers,
            model_config.num_kv_heads,
            model_config.head_dim,
            kv_dtype or model_config.dtype,
            block_size,
        )
        self.pool = KVPool(spec, num_pages, self.device, kv_scales)
        self.req_to_token = torch.zeros(
            max_reqs, model_config.max_model_len, dtype=torch.int32, device=self.device
        )
        self.backend = create_attention_backend(backend, model_config, self.pool, self.device)
        self.next_slot = block_size  # page 0 is the pool's padding target
        self.rows: dict[str, int] = {}
        self.lens: dict[str, int] = {}

    def forward_batch(self, items: list[tuple[str, list[int]]], expert_recorder=None):
        from tokenspeed.runtime.execution.forward_batch import ForwardBatch

        input_ids, positions, locs, rows, seq_lens, ext_lens, prefix_lens = [], [], [], [], [], [], []
        for rid, new in items:
            if rid not in self.rows:
                self.rows[rid] = len(self.rows)
                self.lens[rid] = 0
            row, prefix = self.rows[rid], self.lens[rid]
            slots = list(range(self.next_slot, self.next_slot + len(new)))
            if slots[-1] >= self.pool.num_slots:
                raise RuntimeError("PagedHarness pool is full; raise num_pages")
            self.next_slot += len(new)
            self.req_to_token[row, prefix : prefix + len(new)] = torch.tensor(slots, dtype=torch.int32)
            self.lens[rid] = prefix + len(new)
            input_ids += new
            positions += range(prefix, prefix + len(new))
            locs += slots
            rows.append(row)
            seq_lens.append(prefix + len(new))
            ext_lens.append(len(new))
            prefix_lens.append(prefix)
        logits_idx = torch.tensor(ext_lens).cumsum(0) - 1

        def t(x, dtype=torch.int64):
            return torch.tensor(x, dtype=dtype, device=self.device)

        return ForwardBatch(
            input_ids=t(input_ids),
            positions=t(positions),
            out_cache_loc=t(locs),
            req_pool_indices=t(rows, torch.int32),
            seq_lens=t(seq_lens, torch.int32),
            extend_lens=t(ext_lens, torch.int32),
            extend_prefix_lens=t(prefix_lens, torch.int32),
            logits_indices=logits_idx.to(self.device),
            req_to_token=self.req_to_token,
            kv_pool=self.pool,
            attn_backend=self.backend,
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=ext_lens,
            is_decode_only=all(n == 1 for n in ext_lens),
            expert_recorder=expert_recorder,
        )

    @torch.no_grad()
    def step(self, items: list[tuple[str, list[int]]], expert_recorder=None) -> torch.Tensor:
        fb = self.forward_batch(items, expert_recorder)
        self.backend.init_forward_metadata(fb)
        return self.model(fb)


@torch.no_grad()
def hf_last_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    """The reference model's float32 logits of the last token of `token_ids` (one sequence, no padding)."""
    device = next(hf_model.parameters()).device
    out = hf_model(input_ids=torch.tensor([token_ids], device=device))
    return out.logits[0, -1].float()
