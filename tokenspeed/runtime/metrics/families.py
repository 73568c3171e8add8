"""How the server's metric families are made: each in the server's own registry, named under the
``tokenspeed:`` prefix and labelled by the server's labels (``model_name``, ``dp_rank``, plus ``app_key``
when set), with any labels of its own after them."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "tokenspeed:"


@dataclass(frozen=True)
class MetricFamilies:
    registry: CollectorRegistry
    labels: list[str]

    def gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(PREFIX + name, doc, [*self.labels, *extra], registry=self.registry)

    def counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(PREFIX + name, doc, [*self.labels, *extra], registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(PREFIX + name, doc, self.labels, buckets=buckets, registry=self.registry)
