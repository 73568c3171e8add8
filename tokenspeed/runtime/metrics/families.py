"""How the server's metric families are made: each in the server's own registry, named under the
``tokenspeed:`` prefix and labelled by the server's labels (``model_name``, ``dp_rank``, plus ``app_key``
when set), with any labels of its own after them."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "tokenspeed:"


@dataclass(frozen=True)
class MetricFamilies:
    registry: CollectorRegistry
    labels: list[str]
    # Every family made here with no labels of its own: `init_rank` creates each rank's series of these at
    # zero, so a family added anywhere is seen by scrapers before any traffic without a second list.
    per_rank: list[Gauge | Counter | Histogram] = field(default_factory=list)

    def _made(self, family, extra: tuple[str, ...] = ()):
        if not extra:
            self.per_rank.append(family)
        return family

    def gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return self._made(Gauge(PREFIX + name, doc, [*self.labels, *extra], registry=self.registry), extra)

    def counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return self._made(Counter(PREFIX + name, doc, [*self.labels, *extra], registry=self.registry), extra)

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return self._made(Histogram(PREFIX + name, doc, self.labels, buckets=buckets, registry=self.registry))

    def init_rank(self, labels: dict[str, str]) -> None:
        """Create one rank's series of every `per_rank` family at zero."""
        for family in self.per_rank:
            family.labels(**labels)
