"""Settings every test shares.

The suite runs on small CPU machines (CI has 2 cores) where servers, supervisors and the test process
compete for the cores. Tiny models run thousands of small ops, and an OpenMP team per process costs far
more than the op itself under that contention, so the test process and every server it starts use one
intra-op thread. Everything talks over loopback only.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)
