"""Programmatic dependent launch stays off where it cannot apply: the CPU (Triton's interpreter has no
`launch_pdl` option, so the keyword must never reach it), whatever TOKENSPEED_PDL says (on GPUs of compute
capability 9 and later it is on unless TOKENSPEED_PDL=0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_a_cpu_launch_never_asks_for_dependent_launch(monkeypatch):
    from tokenspeed.runtime.kernels import pdl

    for value in (None, "0", "1"):
        if value is None:
            monkeypatch.delenv("TOKENSPEED_PDL", raising=False)
        else:
            monkeypatch.setenv("TOKENSPEED_PDL", value)
        assert not pdl.enabled(torch.device("cpu"))
        assert pdl.launch_kwargs(torch.device("cpu")) == {"PDL": False}


_RMS_NORM_CHECK = """
import torch
from tokenspeed.runtime.kernels.fused_ops import rms_norm
x, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
y, res = rms_norm(x, w, 1e-6, r)
h = x + r
assert torch.equal(res, h)
torch.testing.assert_close(y, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
print("ok")
"""


def test_the_fused_ops_run_in_the_interpreter_with_pdl_asked_for():
    """TOKENSPEED_PDL=1 on a machine without a GPU changes nothing: RMSNorm, which takes the PDL keywords,
    still computes its reference in Triton's interpreter (read at import, hence a process of its own)."""
    env = {**os.environ, "TOKENSPEED_PDL": "1", "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _RMS_NORM_CHECK], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
