"""Which servers of the fleet have experts, in the words the Experts screen and the expert keys use.

A dense server has no expert load to show, record or rebalance: rather than a hint that then fails, the
console says so, names the MoE servers, and offers `m` to show the next one (the supervisor tells each
server's `moe` from its model's config.json; None where it cannot know, as in an older recording).
"""

from __future__ import annotations

from rich.text import Text

from console.tui.model import Fleet

EXPERT_ACTIONS = ("expert_record_start", "expert_record_stop", "rebalance_experts")


def moe_servers(fleet: Fleet | None) -> list[str]:
    return [s.name for s in fleet.servers if s.moe] if fleet is not None else []


def next_moe_server(fleet: Fleet | None, current: str | None) -> str | None:
    """The MoE server after `current` in the fleet's order (round the end), or None when there is none."""
    names = moe_servers(fleet)
    if not names:
        return None
    order = [s.name for s in fleet.servers] if fleet is not None else []
    after = order.index(current) if current in order else -1
    return next((n for n in order[after + 1 :] + order[: after + 1] if n in names), names[0])


def _where_experts_are(fleet: Fleet | None, current: str | None) -> str:
    target = next_moe_server(fleet, current)
    if target is None:
        return "no server of this fleet serves a MoE model"
    return f"MoE servers: {', '.join(moe_servers(fleet))}; press m to show {target}"


def no_expert_load_text(fleet: Fleet | None, name: str | None) -> Text:
    """What the Experts screen says in place of a heatmap when the server exports no expert load."""
    server = fleet.server(name) if fleet is not None else None
    if server is None or server.moe is None:
        return Text(
            "no expert load exported (a dense model, or expert recording is off: x starts it on a MoE server)",
            style="dim",
        )
    if server.moe:
        return Text(f"no expert load exported: expert recording is off on {name}; press x to start it")
    text = Text(f"{name} serves a dense model: it has no experts.\n", style="bold")
    text.append(_where_experts_are(fleet, name))
    return text


def dense_refusal(fleet: Fleet | None, action: str, targets: list[str]) -> str | None:
    """Why an expert action cannot apply to `targets` (all known dense), or None when it may."""
    if action not in EXPERT_ACTIONS or fleet is None or not targets:
        return None
    servers = [fleet.server(t) for t in targets]
    if not all(s is not None and s.moe is False for s in servers):
        return None
    which = ", ".join(targets)
    return (
        f"{which} serve{'s' if len(targets) == 1 else ''} a dense model: no experts; "
        + _where_experts_are(fleet, targets[0]).replace("press m", "on the Experts screen (3) press m")
    )
