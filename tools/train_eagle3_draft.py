"""Train the EAGLE3 draft TokenSpeed ships for the `demo` model (tokenspeed/assets/demo-eagle3), on the CPU.

Self-distillation: the draft learns what the demo model itself writes, since acceptance is measured
against the target's own greedy output. Prompts come from the demo model's training split of the corpus
(tools/demo_corpus.py; the same shuffle and split as tools/train_demo_model.py): the opening words of a
paragraph, or a chat question under the ChatML template. The demo model continues each greedily; the
draft is trained on prompt + continuation against the target's next-token distribution, with EAGLE3's
training-time test (several draft steps unrolled on the draft's own hidden states, a loss on each) so
that the later draft steps are accurate too. Held-out prompts (the validation split) then measure the mean
acceptance length at 4 draft tokens, counted as vLLM does (accepted drafts + 1 per verify step).

    python tools/train_eagle3_draft.py --corpus .train/corpus.jsonl.gz \\
        --out .train/run1/demo-eagle3 --report .train/run1/report.json

The shipped draft is that run continued twice with `--init` on fresh prompts (`--prompt-seed`); the exact
commands and figures are in docs/DEMO_MODELS.md. A smoke run: `--train-prompts 32 --eval-prompts 4
--train-seconds 10`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_target import DemoTarget  # noqa: E402
from eagle3_draft import DraftShape, Eagle3Draft, load_draft, save_draft  # noqa: E402
from train_demo_model import IM_END, IM_START, RunLog, load_corpus  # noqa: E402

DEMO = Path(__file__).resolve().parent.parent / "tokenspeed" / "assets" / "demo"
AUX_LAYERS = (0, 1, 2)
EOS_IDS = (0, 2)


def split_docs(corpus: Path) -> tuple[list, list]:
    """The demo model's documents in its own order: (train, validation), each item text or a chat."""
    texts, chats = load_corpus(corpus)
    docs: list = list(texts) + list(chats)
    # Same seed and order as train_demo_model.main, so the validation documents are held out from both.
    random.Random(0).shuffle(docs)
    n_val = max(1, len(docs) // 25)
    return docs[n_val:], docs[:n_val]


def make_prompts(docs: list, tok, n: int, seed: int) -> list[list[int]]:
    """n prompts: the first 3-40 tokens of a paragraph, or (one in three) a chat question."""
    rng = random.Random(seed)
    paragraphs = [p for d in docs if isinstance(d, str) for p in d.split("\n\n") if len(p) > 80]
    questions = [d[0]["content"] for d in docs if not isinstance(d, str)]
    prompts = []
    for _ in range(n):
        if rng.random() < 1 / 3:
            text = f"{IM_START}user\n{rng.choice(questions)}{IM_END}\n{IM_START}assistant\n"
            prompts.append(tok(text, add_special_tokens=False)["input_ids"])
        else:
            ids = tok(rng.choice(paragraphs), add_special_tokens=False)["input_ids"]
            prompts.append(ids[: rng.randint(3, 40)])
    return prompts


def generate(target: DemoTarget, prompts: list[list[int]], max_new: int, batch: int = 64):
    """(prompt + greedy continuation up to and including an EOS, prompt length) for every prompt."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # little left padding per batch
    out: list = [None] * len(prompts)
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        for i, cont in zip(chunk, target.greedy([prompts[i] for i in chunk], max_new, EOS_IDS), strict=True):
            out[i] = (prompts[i] + cont, len(prompts[i]))
    return out


def batches(seqs: list[tuple[list[int], int]], max_tokens: int, rng: random.Random):
    """Right-padded batches of sequences of similar length (padding never reaches a real position: causal)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    groups, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(seqs[i][0]) > max_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    for g in groups:
        width = max(len(seqs[i][0]) for i in g)
        ids = torch.zeros(len(g), width, dtype=torch.long)
        lengths = torch.tensor([len(seqs[i][0]) for i in g])
        prompt_lens = torch.tensor([seqs[i][1] for i in g])
        for row, i in enumerate(g):
            ids[row, : len(seqs[i][0])] = torch.tensor(seqs[i][0])
        yield ids, lengths, prompt_lens


def ttt_loss(
    draft, target: DemoTarget, ids, lengths, steps: int, decay: float
) -> tuple[torch.Tensor, list[float]]:
    """Soft cross-entropy against the target's distribution over the draft vocabulary, summed over steps."""
    aux, target_logits = target.states(ids)
    step_logits = draft.unroll(target.embed, ids, aux, steps)
    t = ids.shape[1] - 1
    pos = torch.arange(t)
    vocab = draft.t2d.nonzero().squeeze(-1)
    total = torch.zeros(())
    accs = []
    for k, logits in enumerate(step_logits):
        # Step k at position t predicts token t+k+2, which the target predicts from position t+k+1.
        valid = (pos[None, :] + k + 2) <= (lengths[:, None] - 1)
        src = (pos + k + 1).clamp(max=t)
        p = torch.softmax(target_logits[:, src][..., vocab], dim=-1)
        ce = -(p * F.log_softmax(logits, dim=-1)).sum(-1)
        total = total + decay**k * (ce * valid).sum() / valid.sum().clamp(min=1)
        hit = (logits.argmax(-1) == p.argmax(-1)) & valid
        accs.append(hit.sum().item() / max(1, valid.sum().item()))
    return total, accs


@torch.no_grad()
def acceptance(draft, target: DemoTarget, seqs, steps: int) -> dict:
    """Mean acceptance length (accepted drafts + 1 per verify step) of chains of `steps` greedy drafts."""
    draft.eval()
    verify_steps = emitted = 0
    hist = [0] * (steps + 1)
    for ids_list, prompt_len in seqs:
        ids = torch.tensor([ids_list])
        aux, _ = target.states(ids)
        preds = [draft.to_target_ids(lg.argmax(-1))[0] for lg in draft.unroll(target.embed, ids, aux, steps)]
        n = len(ids_list)
        root = prompt_len - 1  # the target's prefill already gave the token at prompt_len
        while root + 2 <= n - 1:
            accepted = 0
            for k in range(min(steps, n - 1 - (root + 1))):
                if preds[k][root].item() != ids_list[root + k + 2]:
                    break
                accepted += 1
            hist[accepted] += 1
            verify_steps += 1
            emitted += accepted + 1
            root += accepted + 1
    draft.train()
    return {
        "mean_acceptance_length": round(emitted / max(1, verify_steps), 3),
        "verify_steps": verify_steps,
        "accepted_histogram": hist,
    }


def pick_vocab(seqs, vocab_size: int, draft_vocab: int) -> tuple[torch.Tensor, float]:
    """The draft vocabulary: the target's most frequent tokens in the training sequences, EOS ids kept."""
    counts = torch.zeros(vocab_size)
    for ids, _ in seqs:
        counts += torch.bincount(torch.tensor(ids), minlength=vocab_size).float()
    counts[list(EOS_IDS)] = math.inf
    keep = counts.topk(draft_vocab).indices.sort().values
    covered = counts[keep][~torch.isinf(counts[keep])].sum() / counts[~torch.isinf(counts)].sum()
    return keep, float(covered)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--target", type=Path, default=DEMO)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--report", type=Path, default=None)
    ap.add_argument("--train-prompts", type=int, default=1500)
    ap.add_argument("--eval-prompts", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-vocab", type=int, default=2048)
    ap.add_argument("--intermediate-size", type=int, default=384)
    ap.add_argument("--steps", type=int, default=4, help="draft steps unrolled in training and measured")
    ap.add_argument("--decay", type=float, default=0.8, help="loss weight of step k is decay**k")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--batch-tokens", type=int, default=1536)
    ap.add_argument("--train-seconds", type=float, default=1020.0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (more than 1 is slower on a busy 2-core machine)",
    )
    ap.add_argument("--init", type=Path, default=None, help="continue from a saved draft folder")
    ap.add_argument("--prompt-seed", type=int, default=1, help="another seed draws other training prompts")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    log = RunLog(width=7)

    tok = AutoTokenizer.from_pretrained(args.target)
    target = DemoTarget(args.target, AUX_LAYERS)
    cfg = SimpleNamespace(**json.loads((args.target / "config.json").read_text()))
    train_docs, val_docs = split_docs(args.corpus)
    train_seqs = generate(
        target, make_prompts(train_docs, tok, args.train_prompts, args.prompt_seed), args.max_new_tokens
    )
    n_gen = sum(len(s) - p for s, p in train_seqs)
    log(
        f"train: {len(train_seqs)} prompts, {n_gen} generated tokens, {sum(len(s) for s, _ in train_seqs)} in all"
    )
    eval_seqs = generate(target, make_prompts(val_docs, tok, args.eval_prompts, 2), args.max_new_tokens)
    log(f"eval: {len(eval_seqs)} held-out prompts, {sum(len(s) - p for s, p in eval_seqs)} generated tokens")

    draft_vocab = min(args.draft_vocab, cfg.vocab_size)
    # the target's attention shape, vocabulary and norm; the draft's own MLP width, vocabulary and aux layers
    shape = DraftShape.like(
        vars(cfg),
        intermediate_size=args.intermediate_size,
        draft_vocab_size=draft_vocab,
        aux_layer_ids=AUX_LAYERS,
        rope_theta=10000.0,
    )
    if args.init is not None:
        draft = load_draft(args.init).train()
        covered = float("nan")
    else:
        draft = Eagle3Draft(shape)
        keep, covered = pick_vocab(train_seqs, cfg.vocab_size, draft_vocab)
        draft.set_vocab(keep)
        # The draft predicts in the target's output space: start from the target's (tied) output
        # embedding rows and final norm rather than from noise.
        with torch.no_grad():
            draft.lm_head.weight.copy_(target.embed.weight[keep])
            draft.norm.weight.copy_(target.w["model.norm.weight"])
    log(
        f"draft: {sum(p.numel() for p in draft.parameters())} parameters; vocab {draft_vocab} covers {covered:.4f}"
    )
    base = acceptance(draft, target, eval_seqs, args.steps)
    log(f"acceptance before training {base}")

    decay_params = [p for p in draft.parameters() if p.dim() >= 2]
    other = [p for p in draft.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay_params, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    rng = random.Random(0)
    start = time.monotonic()
    step = epoch = 0
    done = False
    while not done:
        epoch += 1
        for ids, lengths, _ in batches(train_seqs, args.batch_tokens, rng):
            progress = (time.monotonic() - start) / args.train_seconds
            if progress >= 1.0:
                done = True
                break
            # Warm-up, then a cosine to 5% that follows elapsed time: the budget is wall-clock.
            lr = (
                args.lr * min(1.0, (step + 1) / 50) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
            )
            for group in opt.param_groups:
                group["lr"] = lr
            loss, accs = ttt_loss(draft, target, ids, lengths, args.steps, args.decay)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 20 == 0:
                log(
                    f"step {step} epoch {epoch} lr={lr:.2e} loss={loss.item():.3f} top1/step={[round(a, 3) for a in accs]}"
                )
    train_s = time.monotonic() - start
    result = acceptance(draft, target, eval_seqs, args.steps)
    log(f"trained {step} steps ({epoch} epochs) in {train_s:.0f}s; held-out acceptance {result}")
    save_draft(draft, args.out, eos_token_id=EOS_IDS[0])
    reloaded = acceptance(load_draft(args.out), target, eval_seqs, args.steps)
    assert reloaded == result, (reloaded, result)  # the saved folder is the draft that was measured
    report = {
        "command": " ".join(sys.argv),
        "train_prompts": len(train_seqs),
        "train_tokens": sum(len(s) for s, _ in train_seqs),
        "generated_tokens": n_gen,
        "draft_vocab": draft_vocab,
        "draft_vocab_coverage": round(covered, 4),
        "parameters": sum(p.numel() for p in draft.parameters()),
        "optimizer_steps": step,
        "epochs": epoch,
        "train_seconds": round(train_s, 1),
        "total_seconds": round(time.monotonic() - log.start, 1),
        "before_training": base,
        "held_out": result,
        "torch": torch.__version__,
    }
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report, indent=2) + "\n")
        args.report.with_suffix(".log").write_text("\n".join(log.lines) + "\n")
    log("finished")


if __name__ == "__main__":
    main()
