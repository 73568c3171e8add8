"""One line per server for what an action's answer says, shown in the notification when it is done.

Most actions need no more than "done"; a rebalance reports its balancedness before and after, and a stop of
expert recording says when the recorder goes on counting (a flag such as --enable-eplb needs the load).
"""

from __future__ import annotations

from typing import Any


def _ratio(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "?"


def describe(name: str, target: str | None, answer: Any) -> str | None:
    """What the operator should read about `target`'s answer to `name`, or None when "done" says it all."""
    if not isinstance(answer, dict):
        return None
    who = target or "fleet"
    if name == "rebalance_experts":
        moved = answer.get("moved_slots")
        return (
            f"{who}: balancedness {_ratio(answer.get('balancedness_before_mean'))} -> "
            f"{_ratio(answer.get('balancedness_after_mean'))}, {moved if moved is not None else '?'} expert "
            f"slots moved (rebalance #{answer.get('rebalances', '?')})"
        )
    if name == "expert_record_stop" and answer.get("recording"):
        return f"{who}: recording session stopped; the recorder keeps counting ({answer.get('reason')})"
    return None
