"""EAGLE3 drafting: after each target step, the draft catches up on the positions the target just computed
(one "extend" over them, fed the target's captured states) and then runs its chain for the next drafts.

For a request whose target step computed positions [s, s + n) (a prefill chunk, a decode, or a verify whose
last m drafts were accepted: n = m + 1), draft position t reads the token at t+1 and the target's states
at t, for t in [s, s + n): the tokens at t+1 are known once the step's tokens are applied (the prompt, the
accepted drafts, the token the target emitted). The output at the last of them predicts the first draft;
each further chain step feeds the previous draft with the draft's own hidden state one position on:

    target:   ... x_t   x_t+1(=emitted)
    draft:    pos t reads (x_t+1, target state t)  -> d1 (the token after x_t+1)
              pos t+1 reads (d1, draft state t)     -> d2, ...

Draft K/V live in a one-layer pool indexed by the target's page table: chain steps write at positions past
the request's computed tokens (their pages are taken here when free, else the chain is cut short), and the
next extend overwrites whatever the target rejected. Draft tokens are the argmax of the draft (a
deterministic proposal, which the verifier treats as one-hot).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from tokenspeed.runtime.cache.kv_cache_manager import KVCacheManager
from tokenspeed.runtime.cache.kv_pool import KVPool, KVPoolSpec
from tokenspeed.runtime.execution.forward_batch import ForwardBatch
from tokenspeed.runtime.layers.attention import create_attention_backend
from tokenspeed.runtime.scheduler.batch import ScheduledBatch
from tokenspeed.runtime.scheduler.request import Request
from tokenspeed.runtime.speculative.config import SpecConfig
from tokenspeed.runtime.speculative.draft_graphs import build_draft_graphs
from tokenspeed.runtime.speculative.eagle3_model import DraftConfig, Eagle3Draft, default_aux_layers

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    """One request's part of the draft extend."""

    req: Request
    rows: list[int]  # its token rows in the target step (for the captured states)
    start: int  # first position
    tokens: list[int]  # the token at t+1 for each position t
    draft: bool  # whether it gets drafts after this step


class Eagle3Proposer:
    def __init__(self, spec: SpecConfig, runner, kv: KVCacheManager):
        self.spec = spec
        self.kv = kv
        self.runner = runner
        self.device = runner.device
        mc = runner.model_config
        cfg = DraftConfig.read(spec.draft_model_path)
        if cfg.vocab_size != mc.vocab_size or cfg.hidden_size != mc.hidden_size:
            raise ValueError(
                f"--speculative-draft-model-path {cfg.path}: the draft is for a target with vocab_size "
                f"{cfg.vocab_size} and hidden_size {cfg.hidden_size}; this model has {mc.vocab_size} and "
                f"{mc.hidden_size}"
            )
        layers = spec.layers_to_capture or cfg.aux_layer_ids or default_aux_layers(mc.num_layers)
        bad = [i for i in layers if not 0 <= i < mc.num_layers]
        if bad:
            raise ValueError(
                f"--eagle3-layers-to-capture {','.join(map(str, layers))}: layers {bad} are outside this "
                f"model's 0..{mc.num_layers - 1}"
            )
        self.layers = tuple(layers)
        embed = runner.model.model.embed_tokens
        self.model = Eagle3Draft.load(
            cfg, len(self.layers), embed, mc.dtype, self.device, max(mc.max_model_len, cfg.max_position)
        )
        pool = runner.kv_pool
        # the draft KV stays in the model dtype (an FP8 target pool keeps its own scales)
        spec_kv = KVPoolSpec(1, cfg.num_kv_heads, cfg.head_dim, mc.dtype, pool.block_size)
        self.pool = KVPool(spec_kv, pool.num_pages, self.device)
        shape = SimpleNamespace(
            num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=mc.dtype,
            num_layers=1,
        )  # fmt: skip
        attn = spec.draft_attention_backend or runner.attn_backend_name
        self.attn = create_attention_backend(attn, shape, self.pool, self.device)
        # the target's graphs (captured now, with these layers' states) and then the draft's own
        runner.set_aux_capture(self.layers)
        self.graphs = build_draft_graphs(self.model, self.attn, self.pool, runner)
        self.force_flat = False
        logger.info(
            "EAGLE3 draft %s: captures target layers %s, %d draft tokens a step, draft vocab %d",
            cfg.path, list(self.layers), spec.num_drafted, cfg.draft_vocab_size,
        )  # fmt: skip

    # ---- the step ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, batch: ScheduledBatch, launched) -> None:
        capture = getattr(launched, "aux_capture", None)
        if capture is None:
            return
        entries = self._entries(batch, launched)
        if not entries:
            return
        aux = capture.stacked()
        rows = torch.tensor([r for e in entries for r in e.rows], device=self.device)
        reqs, starts, tokens = (
            [e.req for e in entries],
            [e.start for e in entries],
            [e.tokens for e in entries],
        )
        if self._flat(sum(map(len, tokens))):
            fb, last = self._flat_batch(reqs, starts, tokens)
            hidden, logits = self._run_flat(fb, self.model.project(aux[rows]))
            logits = logits[last]  # a flat forward returns every row's logits
        else:
            fb = self._batch(reqs, starts, tokens)
            hidden, logits = self.model(fb, aux[rows], from_target=True)
            last = fb.logits_indices
        drafting = [i for i, e in enumerate(entries) if e.draft]
        if not drafting or self.spec.num_drafted == 0:
            return
        sel = torch.tensor(drafting, device=self.device)
        h = hidden[last[sel]]
        tokens = self.model.to_target_ids(logits[sel].argmax(dim=-1))
        reqs = [entries[i].req for i in drafting]
        chain = [[t] for t in tokens.tolist()]
        # positions of the next chain step: one past each request's last extended position
        pos = [len(r.token_ids) - 1 for r in reqs]
        active = [self._room(r, self.spec.num_drafted - 1) for r in reqs]
        for step in range(1, self.spec.num_drafted):
            live = [i for i, n in enumerate(active) if n >= step]
            if not live:
                break
            idx = torch.tensor(live, device=self.device)
            args = (
                [reqs[i] for i in live],
                [pos[i] + step - 1 for i in live],
                [[chain[i][-1]] for i in live],
            )
            if self._flat(len(live)):
                h_live, logits = self._run_flat(self._flat_batch(*args)[0], h[idx])
            else:
                h_live, logits = self.model(self._batch(*args), h[idx], from_target=False)
            h = h.clone()
            h[idx] = h_live
            nxt = self.model.to_target_ids(logits.argmax(dim=-1)).tolist()
            for i, t in zip(live, nxt, strict=True):
                chain[i].append(t)
        for r, c in zip(reqs, chain, strict=True):
            r.draft_ids = c

    def _entries(self, batch: ScheduledBatch, launched) -> list[_Entry]:
        runs = launched.result.runs if launched.result is not None else None
        out, row = [], 0
        for i, it in enumerate(batch.items):
            first = row
            row += it.num_new_tokens
            req = it.req
            if req.is_finished or req.row is None or it.epoch != req.epoch:
                continue
            run = runs[i] if runs is not None else None
            n = len(run.tokens) if run is not None else it.num_new_tokens
            tokens = req.token_ids[it.start + 1 : it.start + n + 1]
            if len(tokens) < n:
                continue  # the target's step gave no token for its last position (cannot happen in sync mode)
            draft = it.sample and req.grammar is None
            if it.sample and req.grammar is not None:
                req.draft_ids = []
            out.append(_Entry(req, list(range(first, first + n)), it.start, tokens, draft))
        return out

    def _flat(self, num_rows: int) -> bool:
        """Whether a draft forward of `num_rows` positions runs one decode row per position: when a graph
        takes it, or always with `force_flat` (which checks that layout on the CPU)."""
        if self.force_flat or (self.graphs is not None and self.graphs.fits(num_rows)):
            return True
        self.runner.graph_use.draft_eager += 1
        return False

    def _run_flat(self, fb: ForwardBatch, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pre-norm outputs, logits) of every row of a flat batch: from a graph, else eagerly."""
        g = self.graphs
        out = g.run(fb, hidden) if g is not None and g.fits(fb.batch_size) else None
        if out is not None:
            return out
        self.runner.graph_use.draft_eager += 1
        self.attn.init_forward_metadata(fb)
        return self.model(fb, hidden, from_target=False)

    def _flat_batch(
        self, reqs: list[Request], starts: list[int], tokens: list[list[int]]
    ) -> tuple[ForwardBatch, torch.Tensor]:
        """The same forward as `_batch`, one decode row per position (for the draft's graphs; their
        replay plans attention), and the row of each request's last position."""
        flat_reqs, flat_starts, flat_tokens, last = [], [], [], []
        for req, start, toks in zip(reqs, starts, tokens, strict=True):
            for j, t in enumerate(toks):
                flat_reqs.append(req)
                flat_starts.append(start + j)
                flat_tokens.append([t])
            last.append(len(flat_tokens) - 1)
        fb = self._batch(flat_reqs, flat_starts, flat_tokens, plan=False)
        n = fb.batch_size
        fb = dataclasses.replace(fb, logits_indices=torch.arange(n, device=self.device))
        return fb, torch.tensor(last, device=self.device)

    def _room(self, req: Request, steps: int) -> int:
        """Chain steps (after the first draft) whose K/V slots the request has, taking pages if free."""
        while steps > 0 and not self.kv.grow(req, steps):
            steps -= 1
        return steps

    def _batch(
        self, reqs: list[Request], starts: list[int], tokens: list[list[int]], plan: bool = True
    ) -> ForwardBatch:
        """A draft forward over positions starts[i] .. + len(tokens[i]) of each request."""
        dev = self.device
        table = self.runner.req_to_token.table
        ids, positions, rows, seq_lens, ext, prefix, last = [], [], [], [], [], [], []
        for req, start, toks in zip(reqs, starts, tokens, strict=True):
            ids.extend(toks)
            positions.extend(range(start, start + len(toks)))
            rows.append(req.row)
            seq_lens.append(start + len(toks))
            ext.append(len(toks))
            prefix.append(start)
            last.append(len(ids) - 1)

        def tensor(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=dev)

        pos_t = tensor(positions)
        rows_t = tensor(rows, torch.int32)
        token_rows = torch.repeat_interleave(rows_t.long(), tensor(ext), output_size=len(positions))
        fb = ForwardBatch(
            input_ids=tensor(ids),
            positions=pos_t,
            out_cache_loc=table[token_rows, pos_t].long(),
            req_pool_indices=rows_t,
            seq_lens=tensor(seq_lens, torch.int32),
            extend_lens=tensor(ext, torch.int32),
            extend_prefix_lens=tensor(prefix, torch.int32),
            logits_indices=tensor(last),
            req_to_token=table,
            kv_pool=self.pool,
            attn_backend=self.attn,
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=ext,
            is_decode_only=all(n == 1 for n in ext),
        )
        if plan:
            self.attn.init_forward_metadata(fb)
        return fb
