"""Train the two demo models TokenSpeed ships: a dense Llama and a Qwen3-MoE, with their own BPE tokenizer.

Input is the corpus built by tools/demo_corpus.py. Everything runs in one process so that it fits one
GPU command: train the byte-level BPE tokenizer, tokenize and pack the corpus, train the dense model and
then the MoE model for a fixed wall-clock budget each, and write two Hugging Face folders (float32
safetensors, tokenizer with a ChatML chat template, generation config). Training time, not step count,
is fixed because the command has a hard time limit; the learning-rate schedule follows elapsed time.

    python tools/train_demo_model.py --corpus .train/corpus.jsonl.gz --out /tmp/demo-out \\
        --dense-seconds 45 --moe-seconds 70

A CPU smoke run: add `--max-steps 3 --batch-size 2`.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SAMPLE_PROMPTS = (
    "The Python interpreter",
    "A list is",
    "In this tutorial, you will learn",
    "When an exception is raised",
)


@dataclass
class TrainSettings:
    seconds: float
    max_steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    eval_every: int


class RunLog:
    """Prints each message behind the seconds since the run began (in `width` columns), keeping the lines
    for the run's log file."""

    def __init__(self, width: int = 6) -> None:
        self.start = time.monotonic()
        self.width = width
        self.lines: list[str] = []

    def __call__(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.start:{self.width}.1f}s] {msg}"
        self.lines.append(line)
        print(line, flush=True)


def load_corpus(path: Path) -> tuple[list[str], list[list[dict]]]:
    texts: list[str] = []
    chats: list[list[dict]] = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if "text" in rec:
                texts.append(rec["text"])
            else:
                chats.append(rec["messages"])
    if not texts:
        raise ValueError(f"--corpus {path}: no text records; build it with tools/demo_corpus.py")
    return texts, chats


def render_chat(messages: list[dict]) -> str:
    # Same string the Jinja template renders; kept in Python so training does not depend on jinja.
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def train_tokenizer(docs: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def pack(docs: list[str], tok: PreTrainedTokenizerFast) -> torch.Tensor:
    """One token stream, documents separated by EOS (GPT-style packing)."""
    eos_id = tok.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for enc in tok(docs, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def _shared_config(vocab: int, seq_len: int, eos_id: int) -> dict:
    """What the dense and the MoE demo share: the attention shape, the vocabulary and the special tokens."""
    return dict(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=seq_len,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        torch_dtype="float32",
    )


def dense_config(vocab: int, seq_len: int, eos_id: int) -> LlamaConfig:
    return LlamaConfig(**_shared_config(vocab, seq_len, eos_id), rms_norm_eps=1e-5)


def moe_config(vocab: int, seq_len: int, eos_id: int) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        **_shared_config(vocab, seq_len, eos_id),
        rms_norm_eps=1e-6,
        moe_intermediate_size=80,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        # The auxiliary balance loss keeps every expert in use, so expert-load metrics are not degenerate.
        output_router_logits=True,
        router_aux_loss_coef=0.01,
    )


def batch_at(stream: torch.Tensor, gen: torch.Generator, batch: int, seq_len: int) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq_len: int, device: str, max_windows: int = 128) -> float:
    model.eval()
    n = min(max_windows, (stream.numel() - 1) // seq_len)
    windows = torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)]).to(device)
    losses = []
    for chunk in windows.split(16):
        # Cross-entropy computed here rather than via `labels=`, which would shift the targets a second time.
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), chunk[:, 1:].reshape(-1)
        )
        losses.append(loss.item())
    model.train()
    return sum(losses) / len(losses)


def lm_loss(model, batch: torch.Tensor, device: str) -> torch.Tensor:
    inputs, targets = batch[:, :-1], batch[:, 1:]
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        out = model(input_ids=inputs, use_cache=False)
    logits = out.logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    aux = getattr(out, "aux_loss", None)
    if aux is not None:
        loss = loss + model.config.router_aux_loss_coef * aux.float()
    return loss


def train(model, train_ids, val_ids, cfg: TrainSettings, device: str, name: str, log) -> dict:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        fused=device == "cuda",
    )
    best = (math.inf, None, 0)
    start = time.monotonic()
    step = 0
    while True:
        progress = (time.monotonic() - start) / cfg.seconds
        if progress >= 1.0 or step >= cfg.max_steps:
            break
        warm = min(1.0, (step + 1) / cfg.warmup_steps)
        lr = cfg.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = batch_at(train_ids, gen, cfg.batch_size, cfg.seq_len).to(device, non_blocking=True)
        loss = lm_loss(model, batch, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            val = evaluate(model, val_ids, cfg.seq_len, device)
            log(
                f"{name} step {step} t={time.monotonic() - start:.0f}s lr={lr:.2e} loss={loss.item():.3f} val={val:.3f}"
            )
            if val < best[0]:
                best = (val, copy.deepcopy(model.state_dict()), step)
    val = evaluate(model, val_ids, cfg.seq_len, device)
    if val < best[0]:
        best = (val, copy.deepcopy(model.state_dict()), step)
    model.load_state_dict(best[1])
    elapsed = time.monotonic() - start
    log(f"{name} done: {step} steps in {elapsed:.0f}s, best val loss {best[0]:.3f} at step {best[2]}")
    return {
        "steps": step,
        "seconds": round(elapsed, 1),
        "best_val_loss": round(best[0], 4),
        "best_step": best[2],
    }


def _rewrite_json(path: Path, update: dict) -> None:
    data = json.loads(path.read_text())
    data.update(update)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save(model, tok: PreTrainedTokenizerFast, out_dir: Path, eos_ids: list[int]) -> None:
    model = model.to("cpu", dtype=torch.float32)
    if hasattr(model.config, "router_aux_loss_coef"):
        model.config.output_router_logits = False
    model.config.use_cache = True
    model.generation_config = GenerationConfig(
        bos_token_id=eos_ids[0],
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[0],
        do_sample=False,
        max_new_tokens=64,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    # Loaders that predate transformers 5 read these names: the classic rope_theta / num_experts keys,
    # the template inside tokenizer_config.json and the PreTrainedTokenizerFast class name.
    legacy: dict = {"rope_theta": 10000.0}
    if hasattr(model.config, "num_experts_per_tok"):
        legacy["num_experts"] = model.config.num_experts
    _rewrite_json(out_dir / "config.json", legacy)
    _rewrite_json(
        out_dir / "tokenizer_config.json",
        {
            "chat_template": CHAT_TEMPLATE,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "additional_special_tokens": [IM_START, IM_END],
            "add_bos_token": False,
            "add_eos_token": False,
        },
    )
    for path in out_dir.iterdir():
        path.chmod(0o644)


@torch.no_grad()
def samples(model, tok, device: str) -> dict[str, str]:
    model.eval()
    out = {}
    for prompt in SAMPLE_PROMPTS:
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
        gen = model.generate(ids, max_new_tokens=40, do_sample=False)
        out[prompt] = tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--dense-seconds", type=float, default=45.0)
    ap.add_argument("--moe-seconds", type=float, default=70.0)
    ap.add_argument("--max-steps", type=int, default=1_000_000)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--only", choices=["dense", "moe"], default=None)
    args = ap.parse_args()

    log = RunLog()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    texts, chats = load_corpus(args.corpus)
    docs = texts + [render_chat(c) for c in chats]
    random.Random(0).shuffle(docs)
    tok = train_tokenizer(docs, args.vocab_size)
    log(f"tokenizer: {len(tok)} tokens; {len(texts)} documents, {len(chats)} chats")
    n_val = max(1, len(docs) // 25)
    val_ids, train_ids = pack(docs[:n_val], tok), pack(docs[n_val:], tok)
    log(f"tokens: train {train_ids.numel()}, validation {val_ids.numel()}; device {device}")
    eos_ids = [tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(IM_END)]
    settings = {
        "dense": (LlamaForCausalLM, dense_config, args.dense_seconds, "demo"),
        "moe": (Qwen3MoeForCausalLM, moe_config, args.moe_seconds, "demo-moe"),
    }
    report = {"tokens_train": train_ids.numel(), "tokens_val": val_ids.numel(), "models": {}}
    for key, (cls, make_config, seconds, folder) in settings.items():
        if args.only and args.only != key:
            continue
        torch.manual_seed(0)
        config = make_config(len(tok), args.seq_len, eos_ids[0])
        model = cls(config).to(device)
        n_params = sum(p.numel() for p in model.parameters())
        log(f"{folder}: {n_params} parameters")
        cfg = TrainSettings(
            seconds=seconds,
            max_steps=args.max_steps,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            lr=args.lr,
            warmup_steps=min(100, max(1, args.max_steps // 10)),
            eval_every=min(args.eval_every, args.max_steps),
        )
        stats = train(model, train_ids, val_ids, cfg, device, folder, log)
        stats["parameters"] = n_params
        stats["samples"] = samples(model, tok, device)
        for prompt, text in stats["samples"].items():
            log(f"{folder} sample: {prompt!r} -> {text!r}")
        save(model, tok, args.out / folder, eos_ids)
        report["models"][folder] = stats
    (args.out / "train_report.json").write_text(json.dumps(report, indent=2))
    (args.out / "train_log.txt").write_text("\n".join(log.lines) + "\n")
    log("finished")


if __name__ == "__main__":
    main()
