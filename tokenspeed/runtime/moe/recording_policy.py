"""Which server flags keep the expert-distribution recorder counting on every step, and why.

Read by the scheduler ranks (the recorder is then never stopped by /stop_expert_distribution_record) and
by the HTTP layer (whose answer to that stop says so). No torch here: the HTTP process imports it.
"""

from __future__ import annotations

from typing import Any

EPLB = "--enable-eplb needs the expert load"
METRICS = "--enable-expert-distribution-metrics exports the expert load"


def recording_kept_by(server_args: Any) -> str | None:
    """The reason the recorder counts with or without a user's recording session, or None."""
    if getattr(server_args, "enable_eplb", False):
        return EPLB
    if getattr(server_args, "enable_expert_distribution_metrics", False):
        return METRICS
    return None
