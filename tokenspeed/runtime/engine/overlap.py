"""Overlap scheduling: while the device runs batch k, the host schedules and launches batch k+1, then
reads back batch k's tokens and updates the scheduler with them.

One step of `EngineCore` in overlap mode (k-1 is the batch left in flight by the previous step):

    schedule k (a running request counts its in-flight token) -> launch k -> resolve k-1 -> outputs

so the device is never idle while the host does k-1's bookkeeping and k's scheduling. A step falls back to
resolving k-1 first (the synchronous order) when a request in flight needs its latest token on the host to
be sampled; this module decides when that is, and whether overlap is allowed at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenspeed.config.slices import RunnerConfig
from tokenspeed.runtime.execution.model_runner import LaunchedBatch
from tokenspeed.runtime.scheduler.batch import ScheduledBatch
from tokenspeed.runtime.scheduler.request import Request


@dataclass
class InFlightBatch:
    """A launched batch whose tokens the scheduler has not seen yet."""

    batch: ScheduledBatch
    launched: LaunchedBatch

    def has_live_request(self) -> bool:
        return any(not it.req.is_finished for it in self.batch.items)


def overlap_mode(config: RunnerConfig, has_peers: bool) -> tuple[bool, str]:
    """(on, why) for the start-up log."""
    if config.disable_overlap_schedule:
        if config.device == "cpu":
            # The default there (see ServerArgs.disable_overlap_schedule); Engine(disable_overlap_schedule=False)
            # still turns it on.
            return False, (
                "off (--disable-overlap-schedule, the default with --device cpu: the host runs the model "
                "itself, so there is no device to run ahead)"
            )
        return False, "off (--disable-overlap-schedule)"
    if has_peers:
        # Peers replay rank 0's batch decisions one step at a time, with the tokens on the host.
        return False, "off (this rank has tensor/expert-parallel peers)"
    return True, "on (the next batch is scheduled and launched while the device runs the current one)"


def needs_host_tokens(req: Request) -> bool:
    """The sampler reads this request's generated token ids on the host (penalties count them), so its
    next token cannot be sampled before its latest one is resolved. Temperature, top-k/p, min-p, seeds,
    logit bias and min_new_tokens read only parameters and the number of outputs, which is known. A grammar
    must accept the latest token before it can say which tokens may follow."""
    sp = req.sampling
    return (
        sp.repetition_penalty != 1.0
        or bool(sp.frequency_penalty)
        or bool(sp.presence_penalty)
        or req.grammar is not None
    )
