"""Prometheus series of the expert load, fed by the schedulers' stats snapshots (the console's Experts screen).

    tokenspeed:expert_load{layer,expert}       tokens routed to a logical expert over the recorder window
    tokenspeed:expert_rank_load{layer,ep_rank} tokens computed by each EP rank over the window
    tokenspeed:eplb_balancedness{layer}        mean / max tokens per EP rank (1.0 = balanced)
    tokenspeed:eplb_rebalances                 live rebalances done (counter)
    tokenspeed:eplb_rebalance_seconds          time decoding stalled for rebalances (counter, seconds)

Every series also carries the server's `model_name` and `dp_rank` labels (and `app_key` when set).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

PREFIX = "tokenspeed:"


class ExpertMetrics:
    def __init__(self, registry: CollectorRegistry, labels: list[str]):
        self.load = Gauge(
            PREFIX + "expert_load",
            "Tokens routed to each logical expert over the expert recorder window.",
            [*labels, "layer", "expert"],
            registry=registry,
        )
        self.rank_load = Gauge(
            PREFIX + "expert_rank_load",
            "Tokens computed by each expert-parallel rank over the expert recorder window.",
            [*labels, "layer", "ep_rank"],
            registry=registry,
        )
        self.balancedness = Gauge(
            PREFIX + "eplb_balancedness",
            "Mean over max tokens per expert-parallel rank, per MoE layer (1.0 is balanced).",
            [*labels, "layer"],
            registry=registry,
        )
        self.rebalances = Counter(
            PREFIX + "eplb_rebalances", "Live expert rebalances (EPLB).", labels, registry=registry
        )
        self.rebalance_seconds = Counter(
            PREFIX + "eplb_rebalance_seconds",
            "Seconds decoding stalled while live rebalances moved experts.",
            labels,
            registry=registry,
        )
        self._last_rebalances: dict[tuple, int] = {}
        self._last_seconds: dict[tuple, float] = {}

    def observe(self, snap: Any, labels: dict[str, str]) -> None:
        """Update from a StatsSnapshot; snapshots without expert figures are ignored."""
        layers = getattr(snap, "expert_layers", None)
        if layers is None:
            return
        for layer, row, ranks, bal in zip(
            layers, snap.expert_load, snap.expert_rank_load, snap.eplb_balancedness, strict=True
        ):
            for expert, tokens in enumerate(row):
                self.load.labels(**labels, layer=str(layer), expert=str(expert)).set(tokens)
            for rank, tokens in enumerate(ranks):
                self.rank_load.labels(**labels, layer=str(layer), ep_rank=str(rank)).set(tokens)
            self.balancedness.labels(**labels, layer=str(layer)).set(bal)
        key = tuple(sorted(labels.items()))
        done = int(getattr(snap, "eplb_rebalances", 0) or 0)
        delta = done - self._last_rebalances.get(key, 0)
        self.rebalances.labels(**labels).inc(delta if delta >= 0 else done)
        self._last_rebalances[key] = done
        stalled = float(getattr(snap, "eplb_rebalance_seconds", 0.0) or 0.0)
        grew = stalled - self._last_seconds.get(key, 0.0)
        self.rebalance_seconds.labels(**labels).inc(grew if grew >= 0 else stalled)
        self._last_seconds[key] = stalled
