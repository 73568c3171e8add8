"""CUDA graphs for an EAGLE3 draft's forwards (GPU only; the CPU never builds them).

Both kinds of draft forward are decode-shaped once each position is a row of its own (seq_len = its
position + 1, the rule of forward_batch.py): the catch-up over the positions a decode or verify step
computed, and each chain step (one token per request). One graph family keyed by the number of rows runs
both: its input is the draft's hidden state [T, H], so the catch-up projects the target's captured states
through `fc` eagerly first (one GEMM), and the graph returns the pre-norm outputs and the draft logits of
every row. Prefill chunks, and anything larger than the largest graph, run eagerly as before.
"""

from __future__ import annotations

import logging

import torch

from tokenspeed.runtime.execution.cuda_graph import CudaGraphRunner, EagerOnce, GraphUse
from tokenspeed.runtime.execution.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class DraftGraphs:
    def __init__(self, model, attn, pool, req_to_token: torch.Tensor, device: torch.device, sizes: list[int],
                 max_context_len: int, use: GraphUse):  # fmt: skip
        self.model = model
        self.use = use
        self.eager_once = EagerOnce(logger)
        self.broken = False
        hidden = torch.zeros(
            max(sizes), model.cfg.hidden_size, dtype=model.weights["norm"].dtype, device=device
        )
        self.runner = CudaGraphRunner(
            self._forward, attn, pool, req_to_token, device, sizes, max_context_len,
            inputs={"hidden": hidden}, label="EAGLE3 draft",
        )  # fmt: skip
        with torch.inference_mode():
            self.runner.capture(progress=False)

    def _forward(self, fb: ForwardBatch):
        return self.model(fb, self.runner.inputs["hidden"][: fb.batch_size], from_target=False)

    def fits(self, num_rows: int) -> bool:
        if self.broken:
            return False
        if self.runner.padded_size(num_rows) is None:
            self.eager_once(f"EAGLE3 draft forwards of more than {self.runner.max_bs} rows")
            return False
        return True

    def run(self, fb: ForwardBatch, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(pre-norm outputs [T, H], draft logits [T, draft vocab]) of a one-row-per-position batch, or None
        when the replay failed (logged once with the batch's shape; the caller then runs eagerly, and so
        does every later draft forward)."""
        try:
            out = self.runner.replay(fb, hidden=hidden)
        except Exception:
            logger.exception(
                "EAGLE3 draft forward from a CUDA graph failed (%d rows, hidden %s, seq_lens %s); the draft "
                "runs eagerly from now on", fb.batch_size, tuple(hidden.shape), fb.seq_lens_cpu[:16],
            )  # fmt: skip
            self.broken = True
            return None
        self.use.draft_replays += 1
        return out


def build_draft_graphs(model, attn, pool, runner) -> DraftGraphs | None:
    """Draft graphs at the target's graph sizes, or None (logged) where the target has none, the draft's
    attention backend cannot be captured, or the capture fails: the draft then runs eagerly."""
    target = runner.graph_runner
    if target is None:
        return None
    if not getattr(attn, "supports_cuda_graph", False):
        logger.info(
            "EAGLE3 draft runs eagerly: its attention backend %s has no CUDA graphs", type(attn).__name__
        )
        return None
    try:
        return DraftGraphs(
            model, attn, pool, runner.req_to_token.table, runner.device, target.sizes,
            runner.model_config.max_model_len, runner.graph_use,
        )  # fmt: skip
    except Exception:
        logger.exception("EAGLE3 draft CUDA graphs could not be captured; the draft runs eagerly")
        torch.cuda.empty_cache()
        return None
