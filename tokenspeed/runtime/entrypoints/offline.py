"""The offline, in-process Engine: `Engine(model=PATH, **server_args_fields).generate(...)`.

It runs one EngineCore in the caller's thread, tokenizes prompts and detokenizes outputs incrementally
(stop strings included: when one appears, the request is finished with reason "stop"). Outputs follow
the native /generate shape:

    {"text": str, "output_ids": [int], "meta_info": {"id", "prompt_tokens", "completion_tokens",
     "cached_tokens", "finish_reason": {"type": "stop", "matched": id|str} | {"type": "length",
     "length": n} | {"type": "abort", "message": str}}}

With `stream=True`, `generate` yields one dict per update: `index` (which prompt/sample), `text` and
`output_ids` holding only what is new, `finished`, and `meta_info` as far as known.

With several ranks (`tp_size` / `attn_tp_size`, `ep_size`), the core is a `RankClient` instead: the
scheduler processes of `tokenspeed serve`, one per rank, driven over ZMQ; everything above stays the same.
Data parallel replicas and other nodes are the server's business (`tokenspeed serve`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tokenspeed.config.flags import FIELD_ALIASES
from tokenspeed.config.support_check import no_effect_warning, refuse_unsupported
from tokenspeed.runtime.engine.io_struct import GenerateRequest, RequestOutput
from tokenspeed.runtime.entrypoints.openai.logprob_format import input_logprobs
from tokenspeed.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class _Sequence:
    index: int
    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    detok: Any
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[list[float]]] = field(default_factory=list)  # per token, [id, logprob] pairs
    prompt_logprobs: list | None = None  # with sampling.prompt_logprobs (RequestOutput.prompt_logprobs)
    text: str = ""
    finished: bool = False
    stop_str: str | None = None
    last: RequestOutput | None = None


def _finish_reason(seq: _Sequence) -> dict[str, Any] | None:
    out = seq.last
    if out is None or not out.finished:
        return None
    if seq.stop_str is not None:
        return {"type": "stop", "matched": seq.stop_str}
    if out.finish_reason == "stop":
        return {"type": "stop", "matched": out.matched_stop}
    if out.finish_reason == "length":
        return {"type": "length", "length": out.completion_tokens}
    return {"type": "abort", "message": out.error or "aborted"}


def _fold_aliases(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    for alias, name in FIELD_ALIASES.items():
        if alias not in out:
            continue
        value = out.pop(alias)
        if name in out and out[name] != value:
            raise ValueError(f"{alias}={value} and {name}={out[name]} set the same field; pass only one")
        out[name] = value
    return out


def _check_offline_layout(mapping: Any) -> None:
    """The Engine runs one replica on this node; say what to use instead of ignoring the rest."""
    if mapping.attn_dp_size > 1:
        raise ValueError(
            f"data_parallel_size={mapping.attn_dp_size} (--data-parallel-size): the offline Engine runs one "
            "data-parallel replica; pass data_parallel_size=1 (tensor and expert parallel sizes are fine), or "
            f"serve the replicas with `tokenspeed serve MODEL --data-parallel-size {mapping.attn_dp_size}`"
        )
    if mapping.nnodes > 1:
        raise ValueError(
            f"nnodes={mapping.nnodes} (--nnodes): the offline Engine runs on one node; start "
            "`tokenspeed serve MODEL --nnodes N --node-rank K --dist-init-addr HOST:PORT` on every node instead"
        )


class Engine:
    def __init__(self, model: str | None = None, **kwargs: Any):
        from tokenspeed.config.server_args import ServerArgs
        from tokenspeed.runtime.engine.engine_core import EngineCore
        from tokenspeed.runtime.engine.tokenizer import get_tokenizer

        if model is None and "model_path" in kwargs:
            model = kwargs.pop("model_path")
        if model is None:
            raise ValueError("Engine needs a model: Engine(model='/path/to/hf-folder', ...)")
        kwargs = _fold_aliases(kwargs)
        kwargs.setdefault("device", "cuda" if torch.cuda.is_available() else "cpu")
        self.server_args = ServerArgs(model=model, **kwargs)
        # Refused settings stop here, before any weight is read; no-effect ones are named once.
        if (warning := no_effect_warning(refuse_unsupported(self.server_args))) is not None:
            logger.warning("%s", warning)
        mapping = self.server_args.mapping
        _check_offline_layout(mapping)
        if mapping.world_size == 1:
            from tokenspeed.runtime.distributed.rank_engine import build_rank_engine, needs_group_peers

            # experts to record, rebalance or replicate: the same rank engine `serve` builds, in process
            if needs_group_peers(self.server_args):
                self.core = build_rank_engine(self.server_args, 0, 0, None, nccl_port=0)
            else:
                self.core = EngineCore(self.server_args)
            self.tokenizer = get_tokenizer(self.server_args)
        else:
            from tokenspeed.runtime.entrypoints.rank_client import RankClient

            # the tokenizer first: a bad tokenizer must not leave rank processes behind
            self.tokenizer = get_tokenizer(self.server_args)
            if "log_level" not in kwargs:
                # the ranks log like a server's schedulers; a library's caller sees their warnings and
                # errors unless it asks for more with log_level
                self.server_args = dataclasses.replace(self.server_args, log_level="warning")
            self.core = RankClient(self.server_args)
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]

    # ---- inputs -------------------------------------------------------------------------------
    def _prompts(self, prompt: Any, input_ids: Any) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt= (text) or input_ids= (token ids)")
        if input_ids is not None:
            single = bool(input_ids) and isinstance(input_ids[0], int)
            return ([list(input_ids)] if single else [list(x) for x in input_ids]), single
        if self.tokenizer is None:
            raise ValueError("this Engine was started with skip_tokenizer_init=True; pass input_ids=")
        single = isinstance(prompt, str)
        texts = [prompt] if single else list(prompt)
        return [self.tokenizer.encode(t) for t in texts], single

    @staticmethod
    def _params(sampling_params: Any, n: int) -> list[SamplingParams]:
        if isinstance(sampling_params, list):
            if len(sampling_params) != n:
                raise ValueError(
                    f"got {len(sampling_params)} sampling_params for {n} prompts; pass one or one each"
                )
            items = sampling_params
        else:
            items = [sampling_params] * n
        out = []
        for sp in items:
            if sp is None:
                sp = SamplingParams()
            elif isinstance(sp, dict):
                sp = SamplingParams.from_dict(sp)
            elif not isinstance(sp, SamplingParams):
                raise ValueError(f"sampling_params must be a dict or SamplingParams, got {type(sp).__name__}")
            sp.verify()
            out.append(sp)
        return out

    def _submit(self, prompt: Any, input_ids: Any, sampling_params: Any) -> tuple[list[_Sequence], bool]:
        from tokenspeed.runtime.engine.detokenizer import IncrementalDetokenizer

        prompts, single = self._prompts(prompt, input_ids)
        seqs: list[_Sequence] = []
        for ids, sp in zip(prompts, self._params(sampling_params, len(prompts)), strict=True):
            for k in range(sp.n):
                # One request per sample; distinct seeds so that n samples of a seeded prompt differ.
                one = SamplingParams.from_dict({**sp.to_dict(), "n": 1})
                if one.seed is not None:
                    one.seed += k
                rid = f"{self._prefix}-{next(self._ids)}"
                detok = (
                    IncrementalDetokenizer(self.tokenizer, ids, one) if self.tokenizer is not None else None
                )
                seqs.append(_Sequence(len(seqs), rid, ids, one, detok))
        try:
            for s in seqs:
                # Always streamed from the core, so stop strings end a request as soon as they appear.
                req = GenerateRequest(
                    s.rid, s.prompt_ids, s.sampling.to_dict(), stream=True, arrival_time=time.time()
                )
                self.core.add_request(req)
        except ValueError:
            for s in seqs:
                self.core.abort_request(s.rid)
            self._drain()
            raise
        return seqs, single and len(seqs) == 1

    def _drain(self) -> None:
        while self.core.has_unfinished():
            self.core.step()

    # ---- outputs ------------------------------------------------------------------------------
    def _apply(self, seq: _Sequence, out: RequestOutput) -> tuple[str, list[int]]:
        seq.last = out
        seq.output_ids.extend(out.new_token_ids)
        if out.prompt_logprobs is not None:
            seq.prompt_logprobs = out.prompt_logprobs
        if out.new_logprobs:
            seq.logprobs.extend(out.new_logprobs)
        if out.new_top_logprobs:
            seq.top_logprobs.extend(out.new_top_logprobs)
        delta = ""
        if seq.detok is not None and not seq.detok.stopped:
            delta, stopped = seq.detok.append(out.new_token_ids, final=out.finished)
            if stopped and not out.finished:
                seq.stop_str = seq.detok.matched_stop
                self.core.abort_request(seq.rid, reason="stop")
            elif stopped:
                seq.stop_str = seq.detok.matched_stop
        seq.text += delta
        seq.finished = out.finished
        return delta, out.new_token_ids

    @staticmethod
    def _meta(seq: _Sequence) -> dict[str, Any]:
        out = seq.last
        meta = {
            "id": seq.rid,
            "prompt_tokens": len(seq.prompt_ids),
            "completion_tokens": len(seq.output_ids),
            "cached_tokens": out.cached_tokens if out else 0,
            "finish_reason": _finish_reason(seq),
        }
        if seq.sampling.logprobs:
            # SGLang's shape: (logprob, token id, token text or None)
            meta["output_token_logprobs"] = [
                (lp, t, None) for lp, t in zip(seq.logprobs, seq.output_ids, strict=False)
            ]
            if seq.sampling.top_logprobs:
                meta["output_top_logprobs"] = [
                    [(lp, int(t), None) for t, lp in alts] for alts in seq.top_logprobs
                ]
        if seq.prompt_logprobs is not None:
            # SGLang's input_token_logprobs / input_top_logprobs, from logprob_start_len on
            meta.update(input_logprobs(seq.prompt_ids, seq.prompt_logprobs, seq.sampling.logprob_start_len))
        return meta

    def _result(self, seq: _Sequence) -> dict[str, Any]:
        return {"text": seq.text, "output_ids": list(seq.output_ids), "meta_info": self._meta(seq)}

    def _run(self, seqs: list[_Sequence]) -> Iterator[tuple[_Sequence, str, list[int]]]:
        by_rid = {s.rid: s for s in seqs}
        try:
            while not all(s.finished for s in seqs):
                for out in self.core.step():
                    seq = by_rid.get(out.rid)
                    if seq is not None:
                        delta, ids = self._apply(seq, out)
                        yield seq, delta, ids
        finally:
            # A consumer that stops early (a closed stream generator) must not leave requests running.
            for s in seqs:
                if not s.finished:
                    self.core.abort_request(s.rid)
            if any(not s.finished for s in seqs):
                self._drain()

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        stream: bool = False,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """One dict per prompt and sample (a single dict for a single prompt); with stream=True, an iterator."""
        seqs, single = self._submit(prompt, input_ids, sampling_params)
        if stream:
            return self._stream(seqs)
        for _ in self._run(seqs):
            pass
        results = [self._result(s) for s in seqs]
        return results[0] if single else results

    def _stream(self, seqs: list[_Sequence]) -> Iterator[dict[str, Any]]:
        for seq, delta, ids in self._run(seqs):
            yield {
                "index": seq.index,
                "text": delta,
                "output_ids": list(ids),
                "finished": seq.finished,
                "meta_info": self._meta(seq),
            }

    # ---- lifecycle ----------------------------------------------------------------------------
    def get_stats(self):
        return self.core.stats()

    def flush_cache(self) -> bool:
        return self.core.flush_cache()

    def shutdown(self) -> None:
        if self.core is not None:
            self.core.shutdown()
            self.core = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
