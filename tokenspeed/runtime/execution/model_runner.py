"""ModelRunner: the model, its KV pool, the attention backend and the sampler of one rank.

It turns a `ScheduledBatch` into a `ForwardBatch` (`prepare`), runs the model (`run`, a captured CUDA
graph for decode batches that fit one) and samples.

A step is `launch` (prepare, forward, sample; the sampled ids stay on the device and are copied to host
memory without waiting) then `resolve` (wait for that copy, build the StepResult).
Between the two the host may launch the next batch: a decode whose input is a token of the launched batch
reads it from that batch's device output, so nothing waits for the host to learn it.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from tokenspeed.config.slices import GraphConfig, RunnerConfig
from tokenspeed.runtime.cache.kv_pool import KVPool, KVPoolSpec, kv_storage_dtype
from tokenspeed.runtime.cache.req_to_token import ReqToTokenTable
from tokenspeed.runtime.distributed.peer_sync import NoPeers, PeerSync
from tokenspeed.runtime.execution import cuda_graph
from tokenspeed.runtime.execution.forward_batch import AuxCapture, ForwardBatch
from tokenspeed.runtime.execution.kv_sizing import plan_num_pages
from tokenspeed.runtime.execution.launched import LaunchedBatch, StepResult, to_host
from tokenspeed.runtime.execution.prompt_logprobs import (
    DevicePromptLogprobs,
    entries_per_item,
    plan_prompt_rows,
    row_indices,
    score_prompt_rows,
)
from tokenspeed.runtime.grammar.bitmask import fill_token_bitmask
from tokenspeed.runtime.layers.attention import create_attention_backend
from tokenspeed.runtime.layers.attention.backend import default_attention_backend
from tokenspeed.runtime.layers.dense_gemv import apply_dense_gemv_backend
from tokenspeed.runtime.layers.sampling import create_sampler
from tokenspeed.runtime.models.loader import DUMMY_WEIGHTS_SEED
from tokenspeed.runtime.models.model_config import ModelConfig
from tokenspeed.runtime.models.quant_tensors import pool_kv_scales
from tokenspeed.runtime.moe.backend import apply_moe_backend
from tokenspeed.runtime.moe.rank_experts import ExpertController, NoExperts
from tokenspeed.runtime.scheduler.batch import ScheduledBatch, ScheduledRequest
from tokenspeed.runtime.scheduler.sample_row import SampleRow
from tokenspeed.runtime.speculative.verifier import verify_batch
from tokenspeed.runtime.startup_phases import StartupPhases

logger = logging.getLogger(__name__)

NAN_ERROR = "the model produced NaN logits; the request was aborted (--enable-nan-detection)"


class ModelRunner:
    def __init__(
        self,
        config: RunnerConfig,
        graphs: GraphConfig,
        model_config: ModelConfig,
        device: torch.device,
        max_num_reqs: int,
        peers: PeerSync | None = None,
        experts: ExpertController | None = None,
        startup: StartupPhases | None = None,
    ):
        """`startup`: where this runner books the seconds of its start-up phases (a fresh one if None)."""
        self.device = device
        self.model_config = model_config
        # With TP/EP peers (distributed/peer_sync.py) the model is this rank's shard and the KV cache and
        # attention see this rank's heads (`kv_config`); alone, the null objects change nothing.
        self.peers: PeerSync = peers if peers is not None else NoPeers()
        self.experts: ExpertController = experts if experts is not None else NoExperts()
        # seconds of each start-up phase, for the ready message (engine/event_loop.py)
        self.startup = startup if startup is not None else StartupPhases()
        with self.startup.phase("model and weights"):
            # dummy weights do not follow --seed (drawn at random when unset): two starts run one model
            loaded = self.peers.load_model(model_config, config.load_format, device, DUMMY_WEIGHTS_SEED)
        self.model = loaded.model
        with self.startup.phase("MoE and GEMV backends"):
            self.experts.attach(self.model, model_config, loaded.expert_state, device)
            apply_moe_backend(self.model, config.moe_backend, device)
            apply_dense_gemv_backend(self.model, config.dense_gemv_backend, device)
        kv_config = self.peers.local_model_config(model_config)
        bs = config.block_size
        if bs < 1:
            raise ValueError(f"--block-size must be >= 1, got {bs}")
        self.spec = KVPoolSpec(
            num_layers=model_config.num_layers,
            num_kv_heads=kv_config.num_kv_heads,
            head_dim=model_config.head_dim,
            dtype=kv_storage_dtype(config.kv_cache_dtype, model_config.dtype),
            block_size=bs,
        )
        attn_name = config.attention_backend or default_attention_backend(device, model_config.dtype)
        with self.startup.phase("KV cache sizing"):
            # Allocated before the pool is sized, so the free memory measured already excludes it.
            self.req_to_token = ReqToTokenTable(max_num_reqs, model_config.max_model_len, bs, device)
            graph_sizes = cuda_graph.verify_graph_sizes(
                cuda_graph.decode_graph_sizes(graphs, device, attn_name, max_num_reqs),
                config.spec_tokens_per_req,
            )
            # Graph memory is held back before the pool takes what is left.
            with cuda_graph.hold_memory(
                cuda_graph.decode_graph_reserve(model_config, graph_sizes, attn_name), device
            ):
                # a draft's KV layer takes pages of the same count: the budget covers both pools
                sizing = dataclasses.replace(
                    self.spec, num_layers=self.spec.num_layers + config.draft_kv_layers
                )
                num_pages = plan_num_pages(config, sizing, device, model_config.max_model_len)
            num_pages = self.peers.agree_num_pages(num_pages)
        kv_started = time.monotonic()
        with self.startup.phase("KV cache"):
            kv_scales = pool_kv_scales(
                config.kv_cache_dtype != "auto",
                config.quantization_param_path,
                getattr(self.model, "kv_scales", None),
                model_config.num_layers,
            )
            self.kv_pool = KVPool(self.spec, num_pages, device, kv_scales)
        logger.info(
            "KV cache: %d pages of %d tokens (%.1f MiB), allocated in %.1f s",
            num_pages - 1,
            bs,
            num_pages * bs * self.spec.bytes_per_token() / (1 << 20),
            time.monotonic() - kv_started,
        )
        attn_opts = {}
        if attn_name == "triton" and config.triton_attention_reduce_in_fp32:
            attn_opts["reduce_in_fp32"] = True
        self.attn_backend_name = attn_name  # an EAGLE3 draft's attention runs on the same backend
        # EAGLE3 (runtime/speculative): target layers whose outputs every step captures for the draft
        self.aux_capture_layers: tuple[int, ...] | None = None
        with self.startup.phase("attention and sampler"):
            self.attn_backend = create_attention_backend(
                attn_name, kv_config, self.kv_pool, device, **attn_opts
            )
            self.sampler = create_sampler(
                config.sampling_backend or "torch", device, config.enable_nan_detection
            )
        # The sampler's kernels load (or compile) now, not at the first sampled token.
        if torch.device(device).type == "cuda":
            warm_s = self.sampler.warm_up(model_config.vocab_size)
            self.startup.add("sampler warm-up", warm_s)
            logger.info("sampler %s: warmed up in %.1f s", self.sampler.name, warm_s)
        self.graph_use = cuda_graph.GraphUse()
        self.eager_once = cuda_graph.EagerOnce(logger)
        self.graph_runner: cuda_graph.CudaGraphRunner | None = None
        self.verify_graphs = True  # off after a verify graph failed
        self.force_verify_as_decode = False
        self._graph_plan = (graph_sizes, graphs)
        if not config.draft_kv_layers:
            self.capture_graphs()
        # else an EAGLE3 proposer names the layers its draft reads (`set_aux_capture`), and the graphs are
        # captured then, storing those layers' states

    def capture_graphs(self) -> None:
        """Capture the decode (and verify) graphs, with the EAGLE3 states if `aux_capture_layers` is set."""
        sizes, graphs = self._graph_plan
        started = time.monotonic()
        self.graph_runner = cuda_graph.build_graph_runner(
            self._forward,
            self.attn_backend,
            self.kv_pool,
            self.req_to_token.table,
            self.device,
            sizes,
            graphs,
            self.model_config.max_model_len,
            aux_layers=self.aux_capture_layers,
        )
        if self.graph_runner is not None:
            self.startup.add("CUDA graphs", time.monotonic() - started)

    def set_aux_capture(self, layers: tuple[int, ...]) -> None:
        """Every step stores the residual stream after `layers` for an EAGLE3 draft; graphs store it too."""
        self.aux_capture_layers = tuple(layers)
        self.graph_runner = None
        self.capture_graphs()

    def _verify_as_decode(self, batch: ScheduledBatch) -> bool:
        """Whether a batch with drafts runs as a decode of its tokens, one row each (from a CUDA graph, or
        eagerly with `force_verify_as_decode`, which checks that layout on the CPU).

        Token i of a request's last token and drafts attends to slots [0, start + i], which is what a
        decode row with seq_len start + i + 1 reads, so every item with one known token (a decode, with
        or without drafts) can be laid out that way; a prefill chunk in the batch cannot."""
        if any(it.num_new_tokens - len(it.draft_ids) != 1 for it in batch.items):
            self.eager_once("a verify step that shares its batch with a prefill chunk")
            return False
        if self.force_verify_as_decode:
            return True
        g = self.graph_runner
        if g is None or not self.verify_graphs:
            if self.device.type == "cuda":
                self.eager_once("verify steps: no CUDA graphs on this server (or a verify graph failed)")
            return False
        num_tokens = sum(it.num_new_tokens for it in batch.items)
        if g.padded_size(num_tokens) is None:
            self.eager_once(
                f"verify steps of more than {g.max_bs} tokens (the largest captured graph; "
                "--cudagraph-capture-sizes or --max-cudagraph-capture-size raise it)"
            )
            return False
        return True

    def prepare(self, batch: ScheduledBatch, prev: LaunchedBatch | None = None) -> ForwardBatch:
        """The ForwardBatch of `batch`. An input token not yet on the host (`req.token_ids` ends before it)
        was sampled by `prev`, the batch launched before, and is copied from its device output."""
        input_ids: list[int] = []
        positions: list[int] = []
        rows, seq_lens, ext_lens, prefix_lens = [], [], [], []
        pending_at, pending_from = [], []
        logits_at: list[int] = []  # the token rows whose logits the step needs
        # a verify step on the GPU: one decode row per token (see _verify_as_decode)
        flat = batch.has_drafts and self._verify_as_decode(batch)
        # Each request's last row (every row of a flat verify, one token a row) is a cumsum on the device;
        # only drafted items in the extend layout need rows listed item by item on the host.
        by_item = batch.has_drafts and not flat
        for it in batch.items:
            end = it.start + it.num_new_tokens
            num_known = it.num_new_tokens - len(it.draft_ids)
            known = it.req.token_ids[it.start : it.start + num_known]
            if len(known) < num_known:
                # Only a decode runs ahead of its host tokens, by the one token of the batch before.
                assert prev is not None and len(known) == num_known - 1, "input token unknown"
                pending_at.append(len(input_ids) + len(known))
                pending_from.append(prev.row_of[it.req])
                known = [*known, 0]  # overwritten on the device below
            if by_item:
                # a drafted item needs the logits of every token it computes: each verifies the next draft
                first_row = len(input_ids) + (num_known - 1 if it.draft_ids else it.num_new_tokens - 1)
                logits_at.extend(range(first_row, len(input_ids) + it.num_new_tokens))
            input_ids.extend(known)
            input_ids.extend(it.draft_ids)
            positions.extend(range(it.start, end))
            if flat:
                rows.extend([it.req.row] * it.num_new_tokens)
                seq_lens.extend(range(it.start + 1, end + 1))
                ext_lens.extend([1] * it.num_new_tokens)
                prefix_lens.extend(range(it.start, end))
            else:
                rows.append(it.req.row)
                seq_lens.append(end)
                ext_lens.append(it.num_new_tokens)
                prefix_lens.append(it.start)
        dev = self.device

        def tensor(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True)

        ids_t = tensor(input_ids)
        if pending_at:
            ids_t.index_copy_(0, tensor(pending_at), prev.token_ids.index_select(0, tensor(pending_from)))
        pos_t = tensor(positions)
        ext_t = tensor(ext_lens, torch.int32)
        rows_t = tensor(rows, torch.int32)
        token_rows = torch.repeat_interleave(rows_t.long(), ext_t.long(), output_size=len(positions))
        return ForwardBatch(
            input_ids=ids_t,
            positions=pos_t,
            out_cache_loc=self.req_to_token.table[token_rows, pos_t].long(),
            req_pool_indices=rows_t,
            seq_lens=tensor(seq_lens, torch.int32),
            extend_lens=ext_t,
            extend_prefix_lens=tensor(prefix_lens, torch.int32),
            logits_indices=tensor(logits_at) if by_item else torch.cumsum(ext_t, 0, dtype=torch.int64) - 1,
            req_to_token=self.req_to_token.table,
            kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=ext_lens,
            is_decode_only=batch.is_decode_only or flat,
            expert_recorder=self.experts.recorder,
            is_verify=batch.has_drafts,
        )

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, prev: LaunchedBatch | None = None) -> LaunchedBatch:
        """Queue the forward and sampling of `batch`; `prev` is the launched batch not yet resolved."""
        self.peers.before_forward(batch)  # peers follow this batch
        items: list[ScheduledRequest] = batch.items
        fb = self.prepare(batch, prev)
        if self.aux_capture_layers is not None:
            fb = dataclasses.replace(fb, aux_capture=AuxCapture(self.aux_capture_layers))
        # Peers keep only the usual rows: the LM head is replicated, so the extra rows need no collective.
        prompt_rows = plan_prompt_rows(items)
        num_rows = fb.logits_indices.shape[0]  # the step's own rows; prompt rows come after them
        if prompt_rows is not None:
            extra = row_indices(prompt_rows, self.device)
            fb = dataclasses.replace(fb, logits_indices=torch.cat([fb.logits_indices, extra]))
        logits = self.run(fb)
        sampled = [i for i, it in enumerate(items) if it.sample]
        launched = LaunchedBatch(num_items=len(items), sampled=sampled)
        if prompt_rows is not None:
            logits, extra_logits = logits[:num_rows], logits[num_rows:]
            scored = score_prompt_rows(prompt_rows, extra_logits)
            launched.prompt_rows = prompt_rows
            launched.prompt_host = DevicePromptLogprobs(
                *(to_host(t) for t in (scored.logprobs, scored.ranks, scored.top_ids, scored.top_logprobs))
            )
        launched.aux_capture = fb.aux_capture
        if batch.has_drafts:
            launched.result = self._verify(items, logits)
            launched.sampled = []
        if not launched.sampled:
            self._record_copies(launched)
            return launched
        rows = logits if len(sampled) == len(items) else logits[torch.tensor(sampled, device=logits.device)]
        # Filled on the host while the device runs the forward queued above; copied without waiting.
        bitmask = fill_token_bitmask([items[i].req.grammar for i in sampled], rows.shape[1], rows.device)
        out = self.sampler.sample(
            rows, [SampleRow(items[i].req, items[i].output_index) for i in sampled], bitmask
        )
        launched.row_of = {items[i].req: j for j, i in enumerate(sampled)}
        launched.token_ids = out.token_ids
        launched.host = [
            to_host(t) for t in (out.token_ids, out.logprobs, out.nan_rows, out.top_ids, out.top_logprobs)
        ]
        self._record_copies(launched)
        return launched

    def _record_copies(self, launched: LaunchedBatch) -> None:
        if self.device.type == "cuda" and (launched.sampled or launched.prompt_rows is not None):
            launched.copied = torch.cuda.Event()
            launched.copied.record()

    def resolve(self, launched: LaunchedBatch) -> StepResult:
        """Wait for a launched batch's sampled tokens and return them per item."""
        result = StepResult(token_ids=[-1] * launched.num_items)
        if launched.copied is not None:
            launched.copied.synchronize()
        if launched.prompt_rows is not None:
            result.prompt_logprobs = entries_per_item(launched.prompt_rows, launched.prompt_host)
        if launched.result is not None:
            launched.result.prompt_logprobs = result.prompt_logprobs
            return launched.result
        if not launched.sampled:
            return result
        token_ids, logprobs, nan_rows, top_ids, top_lps = (
            None if t is None else t.tolist() for t in launched.host
        )
        for j, i in enumerate(launched.sampled):
            result.token_ids[i] = token_ids[j]
        if logprobs is not None:
            result.logprobs = [0.0] * launched.num_items
            for j, i in enumerate(launched.sampled):
                result.logprobs[i] = logprobs[j]
        if top_ids is not None:
            result.top_logprobs = [[] for _ in range(launched.num_items)]
            for j, i in enumerate(launched.sampled):
                result.top_logprobs[i] = list(zip(top_ids[j], top_lps[j], strict=True))
        if nan_rows is not None and any(nan_rows):
            result.errors = [None] * launched.num_items
            for j, i in enumerate(launched.sampled):
                if nan_rows[j]:
                    result.errors[i] = NAN_ERROR
        return result

    def _verify(self, items: list[ScheduledRequest], logits: torch.Tensor) -> StepResult:
        """A batch with drafted items (speculative decoding): each of those has one logit row per token it
        computed and is verified; the other sampling items draw as usual from their one row."""
        v = verify_batch(items, logits, self.sampler, NAN_ERROR)
        return StepResult(
            token_ids=v.token_ids,
            logprobs=v.logprobs,
            errors=v.errors,
            top_logprobs=v.top_logprobs,
            runs=v.runs,
        )

    @torch.inference_mode()
    def run(self, fb: ForwardBatch, use_graphs: bool = True) -> torch.Tensor:
        """The forward of a prepared batch: [B, vocab] logits of each request's last new token.

        The one way a forward runs (rank 0's steps, a peer's copy of them, benchmarks): a captured graph
        when one fits the batch (unless `use_graphs=False`), else eagerly; then the experts close the pass.
        """
        g = self.graph_runner
        logits = None
        if use_graphs and g is not None and g.can_run(fb):
            try:
                logits = g.replay(fb)
            except Exception:
                if not fb.is_verify:
                    raise
                # A verify graph that fails (a shape no capture foresaw) must not take serving down: this
                # step and the later ones verify eagerly, as they did before verify graphs existed.
                logger.exception(
                    "verify step from a CUDA graph failed (%d token rows, seq_lens %s); verifying eagerly "
                    "from now on", fb.batch_size, fb.seq_lens_cpu[:16],
                )  # fmt: skip
                self.verify_graphs = False
        if logits is not None:
            if fb.is_verify:
                self.graph_use.verify_replays += 1
            else:
                self.graph_use.decode_replays += 1
        else:
            if fb.is_verify:
                self.graph_use.verify_eager += 1
            self.attn_backend.init_forward_metadata(fb)
            logits = self._forward(fb)
        self.experts.after_forward()
        return logits

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        # what a CUDA graph captures: the model alone, without the per-pass expert bookkeeping; the
        # recorder's device counting is part of it (the capture batch is built without a recorder)
        if fb.expert_recorder is None and self.experts.recorder is not None:
            fb = dataclasses.replace(fb, expert_recorder=self.experts.recorder)
        return self.model.forward(fb)

    def shutdown(self) -> None:
        self.graph_runner = None  # its graphs pin the pool's and the activations' memory
        self.model = None
        self.kv_pool = None
        self.attn_backend = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
