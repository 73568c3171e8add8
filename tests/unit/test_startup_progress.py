"""Start-up progress: weights loading reports bytes and rate, redrawn on a terminal and as plain log lines
in a log file; CUDA graph capture counts n/m the same way (its GPU path runs in tests/gpu)."""

from __future__ import annotations

import io
import logging
import re

from tokenspeed.demo_models import demo_model_path
from tokenspeed.runtime.models.loader import iterate_weights, weight_files
from tokenspeed.runtime.startup_progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_weights_progress_logs_bytes_and_rate(caplog):
    fmt, files = weight_files(demo_model_path("demo"), "auto")
    with caplog.at_level(logging.INFO, logger="tokenspeed.runtime.models.loader"):
        tensors = dict(iterate_weights(files, fmt))
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    lines = [r.getMessage() for r in caplog.records]
    summary = [m for m in lines if re.fullmatch(r"weights: [\d.]+ MiB in [\d.]+ s \([\d.]+ [KMG]?i?B/s\)", m)]
    assert summary and f"{size / 2**20:.1f} MiB" in summary[-1], lines


def test_progress_redraws_on_a_terminal_and_logs_plain_lines_otherwise(caplog):
    logger = logging.getLogger("test.progress")
    terminal = _Terminal()
    with caplog.at_level(logging.INFO, logger="test.progress"):
        bar = Progress("CUDA graphs captured", 4, logger, unit="items", stream=terminal)
        bar._last_draw = -1.0  # draw the first step at once
        bar.advance(1)
        bar.finish()
        log = io.StringIO()
        plain = Progress("weights", 3 << 30, logger, stream=log, log_every_s=0.0)
        for _ in range(3):
            plain.advance(1 << 30)
        plain.finish()
    assert "\rCUDA graphs captured 1/4" in terminal.getvalue().replace("\033[K", "")
    assert terminal.getvalue().endswith("\r\033[K")  # the status line is cleared before the summary
    assert log.getvalue() == ""  # not a terminal: nothing drawn, only log records
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "CUDA graphs captured: 1/4 in 0.0 s"
    assert [m.split(" (")[0] for m in messages[1:4]] == ["weights 1.0 GiB/3.0 GiB", "weights 2.0 GiB/3.0 GiB",
                                                       "weights 3.0 GiB/3.0 GiB"]  # fmt: skip
    assert re.fullmatch(r"weights: 3\.0 GiB in [\d.]+ s \([\d.]+ [KMGT]?i?B/s\)", messages[-1]), messages
