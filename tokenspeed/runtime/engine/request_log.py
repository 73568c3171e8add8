"""Per-request log lines: `--enable-log-requests` (with `--log-requests-level`) and
`--enable-log-request-stats` (one line per finished request).

Levels: 0 ids and sizes; 1 adds the sampling parameters; 2 adds prompt and output text cut to 2048
characters; 3 logs them whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tokenspeed.config.server_args import ServerArgs

logger = logging.getLogger("tokenspeed.requests")

_CUT = 2048


def _cut(text: str, level: int) -> str:
    return text if level >= 3 or len(text) <= _CUT else text[:_CUT] + f"...(+{len(text) - _CUT} chars)"


@dataclass
class RequestLogger:
    log_requests: bool = False
    level: int = 0
    log_stats: bool = False
    tokenizer: Any = None

    @classmethod
    def from_server_args(cls, server_args: ServerArgs, tokenizer: Any) -> RequestLogger:
        return cls(
            log_requests=server_args.enable_log_requests,
            level=server_args.log_requests_level,
            log_stats=server_args.enable_log_request_stats,
            tokenizer=tokenizer,
        )

    def _text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return str(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def received(self, req: Any) -> None:
        if not self.log_requests:
            return
        parts = [f"request rid={req.rid} prompt_tokens={len(req.input_ids)}"]
        if self.level >= 1:
            parts.append(f"sampling={req.sampling.to_dict()}")
        if self.level >= 2:
            parts.append(f"prompt={_cut(self._text(req.input_ids), self.level)!r}")
        logger.info(" ".join(parts))

    def finished(self, req: Any, stats: Any) -> None:
        if self.log_requests:
            parts = [
                f"finished rid={req.rid} reason={stats.finish_reason} completion_tokens={stats.completion_tokens}"
            ]
            if self.level >= 2:
                parts.append(f"output={_cut(req.detok.text, self.level)!r}")
            logger.info(" ".join(parts))
        if self.log_stats:
            ttft = "-" if stats.ttft is None else f"{stats.ttft:.4f}s"
            logger.info(
                "request_stats rid=%s dp_rank=%d prompt_tokens=%d completion_tokens=%d cached_tokens=%d "
                "ttft=%s e2e=%.4fs finish_reason=%s",
                req.rid,
                stats.dp_rank,
                stats.prompt_tokens,
                stats.completion_tokens,
                stats.cached_tokens,
                ttft,
                stats.e2e_latency,
                stats.finish_reason,
            )
