"""`tokenspeed reload`: a profile edited while the fleet runs takes effect, on only the servers it changes."""

from __future__ import annotations

import json


def _edit(fleet, old: str, new: str) -> None:
    text = fleet.profile.read_text()
    assert old in text, old
    fleet.profile.write_text(text.replace(old, new, 1))


def test_reload_refuses_a_bad_profile_then_applies_only_what_changed(make_fleet):
    fleet = make_fleet(replicas=2)
    assert fleet.up().returncode == 0
    a, b = fleet.server(0), fleet.server(1)
    before = fleet.servers()

    # A profile that does not resolve is refused with its error; nothing is restarted.
    _edit(fleet, 'device = "cpu"', 'device = "cpu"\nmax_total_tokenz = 4096')
    refused = fleet.cli("reload")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "max_total_tokenz" in refused.stderr and "max_total_tokens" in refused.stderr  # did you mean
    assert "the running fleet is unchanged" in refused.stderr
    assert {n: s["pid"] for n, s in fleet.servers().items()} == {n: s["pid"] for n, s in before.items()}

    # One more replica: the dry run says so, the reload starts it and leaves the others running.
    _edit(fleet, "max_total_tokenz = 4096", "")
    _edit(fleet, "replicas = 2", "replicas = 3")
    dry = fleet.cli("reload", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"{fleet.server(2)}: added" in dry.stdout and f"{a}: unchanged" in dry.stdout
    assert "dry run, nothing applied" in dry.stdout
    assert fleet.server(2) not in fleet.servers()
    applied = fleet.cli("reload")
    assert applied.returncode == 0, applied.stderr
    assert f"start {fleet.server(2)}" in applied.stdout
    servers = fleet.wait_for(
        lambda s: s.get(fleet.server(2), {}).get("state") == "READY", what="the new server"
    )
    assert servers[a]["pid"] == before[a]["pid"] and servers[b]["pid"] == before[b]["pid"]

    # A server setting: every server restarts with it, one at a time; the replica removed stops.
    _edit(fleet, "replicas = 3", "replicas = 2")
    _edit(fleet, 'device = "cpu"', 'device = "cpu"\nmax_total_tokens = 4096')
    result = json.loads(fleet.cli("reload", "--json").stdout)
    changes = {s["name"]: s for s in result["servers"]}
    assert changes[a]["change"] == "changed" and changes[a]["fields"]["max_total_tokens"] == [None, 4096]
    assert changes[fleet.server(2)]["change"] == "removed"
    assert result["restart"] == [a, b] and result["stop"] == [fleet.server(2)]
    servers = fleet.wait_for(
        lambda s: (
            fleet.server(2) not in s
            and all(s[n]["state"] == "READY" and s[n]["pid"] != before[n]["pid"] for n in (a, b))
        ),
        timeout=60,
        what="the rolling restart",
    )
    # One at a time: the second server went down only after the first was READY again.
    assert servers[b]["started_at"] > servers[a]["started_at"]
    for name in (a, b):
        last_argv = (fleet.control / f"{name}.argv").read_text().splitlines()[-1]
        assert "--max-total-tokens" in json.loads(last_argv)
    assert "profile reloaded" in fleet.cli("logs", a, "-n", "50").stdout
    # Nothing left to do: the profile now matches the fleet.
    again = fleet.cli("reload")
    assert "nothing to do" in again.stdout
