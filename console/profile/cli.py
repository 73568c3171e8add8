"""What `tokenspeed profile validate | show | plan | new` do; each returns the process exit code."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from console.profile.fleet import ProfileError, load_and_resolve
from tokenspeed.config.api_key import API_KEY_ENV

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def validate(paths: list[str], here: bool = True) -> int:
    """Check each file, with the pre-flight of `tokenspeed up` (console/profile/preflight.py) unless `here`
    is False; a file that only serves as the `extends` base of others given with it (as `profiles/*.toml`
    passes `_base.toml`) is checked through them, not as a fleet of its own."""
    from console.profile.preflight import preflight

    reports = {path: preflight(path, models=here, here=here) for path in paths}
    extended_by: dict[Path, list[str]] = {}
    for path in paths:
        for source in _sources(path):
            if source != Path(path).resolve():
                extended_by.setdefault(source, []).append(path)
    failed = 0
    for path in paths:
        report = reports[path]
        if report.ok:
            fleet = report.resolved.profile.fleet
            click.echo(
                f"{path}: ok (fleet {fleet.name}, {len(report.resolved.servers)} server(s), launcher {fleet.launcher})"
            )
            continue
        users = extended_by.get(Path(path).resolve())
        if users:
            click.echo(f"{path}: ok (a base, extended by {', '.join(users)}; checked through them)")
            continue
        # Not only the first mistake: every one found, each with its file:line and the fix.
        for problem in report.problems:
            click.echo(f"error: {problem}", err=True)
        click.echo(f"{path}: {len(report.problems)} error(s)", err=True)
        failed += 1
    if failed and here:
        click.echo(
            "(checked for this machine: models, ports, state directory; a profile meant for another machine "
            "is checked alone with --no-preflight)",
            err=True,
        )
    return EXIT_USAGE if failed else EXIT_OK


def _sources(path: str) -> tuple[Path, ...]:
    """The file and every file it extends (none when it cannot be read)."""
    from console.profile.toml import read_profile

    try:
        return tuple(read_profile(path).sources)
    except ProfileError:
        return ()


def problems_text(problems) -> str:
    """Every problem a line, then what they stopped."""
    lines = [f"error: {p}" for p in problems]
    return "\n".join([*lines, f"{len(lines)} problem(s); nothing was started"])


def show(path: str, as_json: bool) -> int:
    try:
        resolved = load_and_resolve(path)
    except (ProfileError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    fleet = resolved.profile.fleet
    servers = []
    for spec, args in zip(resolved.servers, resolved.server_args, strict=True):
        servers.append(
            {
                "name": spec.name,
                "url": spec.url,
                "world_size": args.mapping.world_size,
                "processes": [
                    {
                        "node": p.node,
                        "node_rank": p.node_rank,
                        "gpus": list(p.gpus),
                        "argv": list(p.argv),
                        # The key stays out of what is printed (terminals, CI logs, tickets).
                        "env": {k: "<secret>" if k == API_KEY_ENV else v for k, v in p.env},
                    }
                    for p in spec.processes
                ],
            }
        )
    if as_json:
        click.echo(
            json.dumps({"fleet": fleet.name, "launcher": fleet.launcher, "servers": servers}, indent=1)
        )
        return EXIT_OK
    click.echo(
        f"fleet {fleet.name}: {len(servers)} server(s), launcher {fleet.launcher}, restart {fleet.restart}"
    )
    for server in servers:
        click.echo(f"  {server['name']}  {server['url']}  world size {server['world_size']}")
        for p in server["processes"]:
            env = " ".join(f"{k}={v}" for k, v in p["env"].items())
            click.echo(
                f"    node {p['node']} rank {p['node_rank']}: {env + ' ' if env else ''}tokenspeed serve {shlex.join(p['argv'])}"
            )
    return EXIT_OK


def plan(path: str, as_json: bool, gpus_from: str | None, model_config: str | None = None) -> int:
    from console.probe import load_probe, probe_gpus
    from console.profile.plan import format_plan, plan_here, plan_with_platform
    from console.profile.preflight import preflight

    # Planned for this machine, the pre-flight of `up` runs too; recorded GPU readings or a given config
    # plan for another machine, whose ports and models are not ours to check.
    report = preflight(path, models=model_config is None and gpus_from is None, here=gpus_from is None)
    if not report.ok:
        click.echo(problems_text(report.problems).replace("nothing was started", "no plan"), err=True)
        return EXIT_USAGE
    resolved = report.resolved
    probe = load_probe(gpus_from) if gpus_from else probe_gpus()
    config = json.loads(Path(model_config).read_text()) if model_config else None
    # On this machine a running fleet's own memory counts as free; a recorded reading is planned as is.
    result = plan_with_platform(resolved, probe, config) if gpus_from else plan_here(resolved, probe, config)
    click.echo(json.dumps(result.to_dict(), indent=1) if as_json else format_plan(result))
    return EXIT_OK if result.fits else EXIT_FAILED


_TEMPLATE = """\
# TokenSpeed fleet profile (`tokenspeed profile validate {file}`, `tokenspeed up {file}`).
# [server] takes ServerArgs fields by their Python names: the flags of `tokenspeed serve --help`.

[server]
model = "{model}"
device = "{device}"
{parallel}
[fleet]
name = "{name}"
replicas = {replicas}
launcher = "local"
base_port = 30000
restart = "on-failure"      # always | on-failure | no
max_restarts = 5            # within restart_window_s, then FATAL
restart_window_s = 300
stop_timeout_s = 30         # SIGTERM, then SIGKILL after this long

[fleet.backoff]
initial_s = 1
max_s = 60
reset_after_s = 60

[fleet.health]
path = "/health"
interval_s = 5
timeout_s = 2
failures = 3

[env]
"""


def new(
    path: str, model: str, name: str | None, replicas: int, tp: int, device: str | None, force: bool
) -> int:
    from console.probe import probe_gpus

    target = Path(path)
    if target.exists() and not force:
        click.echo(f"error: {target} exists; use --force to overwrite", err=True)
        return EXIT_USAGE
    if device is None:
        # A machine without GPUs can only serve on CPU: plan what can actually run here.
        device = "cuda" if probe_gpus().kind == "nvidia" else "cpu"
    parallel = f"attn_tp_size = {tp}\n" if tp > 1 else ""
    text = _TEMPLATE.format(
        file=target.name,
        model=model,
        device=device,
        parallel=parallel,
        name=name or target.stem,
        replicas=replicas,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    try:
        load_and_resolve(target)
    except (ProfileError, ValueError) as exc:
        click.echo(f"wrote {target}, but it does not validate: {exc}", err=True)
        return EXIT_USAGE
    click.echo(f"wrote {target} (device {device}); check it with `tokenspeed profile plan {target}`")
    return EXIT_OK
