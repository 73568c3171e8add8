"""Layer x expert load heatmap, drawn as coloured cells scaled to the hottest expert."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.color import Color
from rich.style import Style
from rich.text import Text

from console.tui.widgets.panel import TextPanel

# The metric families the Experts screen reads (after the `tokenspeed:` prefix); the rest of /metrics is
# skipped before parsing, which was most of what a poll of the screen cost.
EXPERT_FAMILIES = ("expert_load", "expert_rank_load", "eplb_balancedness", "eplb_rebalances")

# Cold to hot; loads are bucketed by their fraction of the maximum.
_RAMP = ("#1d2b53", "#1f5f8b", "#1a936f", "#88d498", "#f3e37c", "#f7a440", "#e4572e", "#ff1f1f")


@dataclass(frozen=True)
class ExpertLoad:
    """Expert metrics of one server at one scrape."""

    load: dict[int, dict[int, float]] = field(default_factory=dict)  # layer -> expert -> tokens
    rank_of: dict[tuple[int, int], int] = field(default_factory=dict)  # (layer, expert) -> EP rank
    balancedness: dict[int, float] = field(default_factory=dict)  # layer -> mean/max per rank
    rebalances: float | None = None
    rank_load: dict[int, float] = field(default_factory=dict)  # EP rank -> tokens, when the server exports it

    @property
    def layers(self) -> list[int]:
        return sorted(self.load)

    @property
    def experts(self) -> list[int]:
        return sorted({e for row in self.load.values() for e in row})

    def rank_loads(self, ep_size: int | None) -> dict[int, float]:
        """Tokens per EP rank over all layers: exported by the server, else from the expert placement."""
        if self.rank_load:
            return dict(self.rank_load)
        experts = self.experts
        totals: dict[int, float] = {}
        for layer, row in self.load.items():
            for expert, value in row.items():
                rank = self.rank_of.get((layer, expert))
                if rank is None:
                    if not ep_size or ep_size < 1 or not experts:
                        return {}
                    per_rank = max(1, -(-len(experts) // ep_size))
                    rank = experts.index(expert) // per_rank
                totals[rank] = totals.get(rank, 0.0) + value
        return totals


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _name(line: str) -> str:
    """The metric name a line of exposition text is about: a sample's, or a HELP/TYPE comment's."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE") else ""
    return line.split("{", 1)[0].split(None, 1)[0] if line.strip() else ""


def expert_lines(text: str) -> str:
    """The lines of exposition `text` about an expert family (samples, HELP and TYPE), in their order."""
    from console.metrics_math import PREFIX

    return "\n".join(
        line for line in text.split("\n") if _name(line).removeprefix(PREFIX).startswith(EXPERT_FAMILIES)
    )


def parse_expert_lines(lines: str) -> ExpertLoad:
    """The ExpertLoad of `expert_lines` of a scrape."""
    # Imported here: the Prometheus parser is only needed once the Experts screen is open.
    from console.metrics_math import parse

    scrape = parse(lines + "\n", 0.0)
    load: dict[int, dict[int, float]] = {}
    rank_of: dict[tuple[int, int], int] = {}
    for labels, value in scrape.labelled.get("expert_load", []):
        layer, expert = _int(labels.get("layer")), _int(labels.get("expert"))
        if layer is None or expert is None:
            continue
        row = load.setdefault(layer, {})
        row[expert] = row.get(expert, 0.0) + value
        rank = _int(labels.get("ep_rank") or labels.get("rank"))
        if rank is not None:
            rank_of[(layer, expert)] = rank
    balancedness: dict[int, float] = {}
    for labels, value in scrape.labelled.get("eplb_balancedness", []):
        layer = _int(labels.get("layer"))
        if layer is not None:
            balancedness[layer] = min(value, balancedness.get(layer, value))
    if not balancedness and "eplb_balancedness" in scrape.values and not load:
        balancedness[0] = scrape.values["eplb_balancedness"]
    rank_load: dict[int, float] = {}
    for labels, value in scrape.labelled.get("expert_rank_load", []):
        rank = _int(labels.get("ep_rank"))
        if rank is not None:
            rank_load[rank] = rank_load.get(rank, 0.0) + value
    rebalances = scrape.get("eplb_rebalances")
    if rebalances is None:
        rebalances = scrape.get("eplb_rebalances_total")
    return ExpertLoad(
        load=load, rank_of=rank_of, balancedness=balancedness, rebalances=rebalances, rank_load=rank_load
    )


def ramp_colour(fraction: float) -> str:
    fraction = min(max(fraction, 0.0), 1.0)
    return _RAMP[min(len(_RAMP) - 1, int(fraction * len(_RAMP)))]


class Heatmap(TextPanel):
    """Renders an ExpertLoad; one row per layer, one cell per expert, balancedness at the end of each row.
    Redrawn only when the drawing changed, re-laid out only when its size can (TextPanel)."""

    def show_load(self, data: ExpertLoad, balanced_at: float = 0.8) -> None:
        self.show(render_heatmap(data, balanced_at))


def hottest(data: ExpertLoad, n: int = 5) -> list[tuple[int, float, float]]:
    """The `n` logical experts with the most tokens over all layers: (expert, tokens, share of all tokens)."""
    totals: dict[int, float] = {}
    for row in data.load.values():
        for expert, value in row.items():
            totals[expert] = totals.get(expert, 0.0) + value
    everything = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [(expert, tokens, tokens / everything) for expert, tokens in ranked]


def _cell_value(value: float, peak: float, width: int) -> str:
    """The value inside its cell: a share of the hottest expert, in tenths (0-9, `*` for the hottest)."""
    if width < 2:
        return " "
    tenth = min(int(10 * value / peak), 9) if peak else 0
    return ("*" if value >= peak else str(tenth)).rjust(width)


def render_heatmap(data: ExpertLoad, balanced_at: float = 0.8) -> Text:
    layers, experts = data.layers, data.experts
    if not layers:
        return Text(
            "no expert load exported (a dense model, or expert recording is off: press x to start it)",
            style="dim",
        )
    cell = 2 if len(experts) <= 64 else 1
    peak = max((v for row in data.load.values() for v in row.values()), default=0.0) or 1.0
    text = Text()
    styles: dict[tuple[str, str], Style] = {}  # (background, ink) -> its cell style, one per kind of cell
    header = "layer ".ljust(7)
    if cell == 2:
        header += "".join(f"{e % 100:<2d}" for e in experts)
    else:
        header += "".join(str(e % 10) for e in experts)
    text.append(header + "  balance\n", style="dim")
    for layer in layers:
        row = data.load[layer]
        text.append(f"{layer:>5}  ")
        for expert in experts:
            value = row.get(expert, 0.0)
            fraction = value / peak
            key = (ramp_colour(fraction), "black" if fraction >= 0.35 else "white")
            style = styles.get(key)
            if style is None:
                style = styles[key] = Style(bgcolor=Color.parse(key[0]), color=Color.parse(key[1]))
            text.append(_cell_value(value, peak, cell), style=style)
        balance = data.balancedness.get(layer)
        if balance is not None:
            # Below the threshold is a problem; only well above it reads as healthy.
            style = (
                "bold red" if balance < balanced_at else ("yellow" if balance < (1 + balanced_at) / 2 else "")
            )
            text.append(f"  {balance:.2f}", style=style)
        text.append("\n")
    text.append(f"cells: tenths of the hottest expert's load (* = hottest); scale 0 .. {peak:.0f} tokens  ",
                style="dim")  # fmt: skip
    for i, colour in enumerate(_RAMP):
        text.append("  ", style=Style(bgcolor=Color.parse(colour)))
        if i == len(_RAMP) - 1:
            text.append(" max", style="dim")
    return text
