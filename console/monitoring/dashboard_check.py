"""`tokenspeed grafana --check PROMETHEUS_URL`: ask a Prometheus every query of the dashboard, as Grafana
would with "All" selected, and print what each panel would draw now (the legend and the latest value of
its first series). A panel with no finite value is reported and makes the command exit 1, so a metric the
fleet no longer exports, or a scrape config that misses the fleet, shows up before anyone opens Grafana.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import httpx

from console.monitoring.panels import ROWS

_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Answer:
    panel: str
    legend: str
    series: int  # series with a finite value
    sample: list[tuple[str, float]]  # (legend, value) of the first few series
    error: str | None = None


def substitute(expr: str, fleet: str = ".*", rate_window: str = "1m") -> str:
    """The expression as Grafana sends it with every variable on "All" (and `fleet` as given)."""
    return (
        expr.replace("$__rate_interval", rate_window)
        .replace("$fleet", fleet)
        .replace("$server", ".*")
        .replace("$model", ".*")
    )


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()


def check(url: str, fleet: str = ".*", rate_window: str = "1m", timeout: float = 10.0) -> list[Answer]:
    answers = []
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout, trust_env=False) as http:
        for row in ROWS:
            for panel in row.panels:
                for query in panel.queries:
                    try:
                        body = http.get(
                            "/api/v1/query", params={"query": substitute(query.expr, fleet, rate_window)}
                        )
                        data = body.json()
                    except (httpx.HTTPError, ValueError) as exc:
                        answers.append(
                            Answer(panel.title, query.legend, 0, [], f"{type(exc).__name__}: {exc}")
                        )
                        continue
                    if data.get("status") != "success":
                        answers.append(Answer(panel.title, query.legend, 0, [], str(data.get("error"))))
                        continue
                    values = [
                        (_legend(query.legend, r["metric"]), float(r["value"][1]))
                        for r in data["data"]["result"]
                    ]
                    finite = sorted((v for v in values if math.isfinite(v[1])), key=lambda v: (-v[1], v[0]))
                    answers.append(Answer(panel.title, query.legend, len(finite), finite[:3]))
    return answers


def _number(value: float) -> str:
    if value == 0 or 0.001 <= abs(value) < 100000:
        return f"{value:.4g}"
    return f"{value:.3g}"


def format_answers(answers: list[Answer]) -> str:
    width = max(len(a.panel) for a in answers)
    lines = []
    for a in answers:
        if a.error:
            shown = f"error: {a.error}"
        elif not a.series:
            shown = "NO DATA"
        else:
            more = f" (+{a.series - len(a.sample)})" if a.series > len(a.sample) else ""
            shown = ", ".join(f"{legend}={_number(v)}" for legend, v in a.sample) + more
        lines.append(f"{a.panel.ljust(width)}  {shown}")
    return "\n".join(lines)
