"""The `tokenspeed` command: one Click group for the server, the fleet and the console.

Every subcommand imports its implementation lazily, so `tokenspeed status` never pays for torch
and `tokenspeed serve` never pays for Textual.

Exit codes a script can rely on (fleet commands):
  0  done (for `up`: every server READY)
  1  the fleet failed (a server FATAL or not READY before the timeout, `down` left processes)
  2  bad usage or a bad profile (nothing was started: the pre-flight lists every problem), a server
     name the fleet does not have, or several fleets running and none chosen (--fleet NAME)
  3  no running fleet found (no supervisor answers)
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_FLEET = 3

_PASSTHROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tokenspeed", prog_name="tokenspeed")
def main() -> None:
    """TokenSpeed: an LLM inference server and the console that runs fleets of it."""


# ---------------------------------------------------------------- server


def _serve_main():
    """The serving entry point, or None while this build has none (only the flag parser)."""
    try:
        from tokenspeed.runtime.entrypoints.serve import main as serve_main
    except ModuleNotFoundError as exc:
        if exc.name not in ("tokenspeed.runtime.entrypoints.serve",):
            raise
        return None
    return serve_main


def _parse_only(args: list[str]) -> int:
    """Without a serving entry point, `serve` still parses (and explains) every ServerArgs flag."""
    import argparse

    from tokenspeed.config.cli import add_cli_args

    parser = argparse.ArgumentParser(prog="tokenspeed serve", allow_abbrev=False)
    add_cli_args(parser)
    parser.parse_args(args)
    click.echo("tokenspeed serve: this build has no serving entry point", err=True)
    return EXIT_FAILED


@main.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def serve(args: tuple[str, ...]) -> None:
    """Run one server: `tokenspeed serve MODEL [flags]` (`tokenspeed serve --help` lists every flag)."""
    serve_main = _serve_main()
    argv = list(args)
    code = serve_main(argv) if serve_main is not None else _parse_only(argv)
    sys.exit(code or 0)


@main.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Benchmarks (decode roofline, offline throughput, serving load); `bench --help` for options."""
    from tokenspeed.bench import main as bench_main

    sys.exit(bench_main(list(args)) or 0)


# ---------------------------------------------------------------- console


@main.command()
@click.argument("target", required=False)
@click.option("--fleet", help="Fleet name (default: the only running fleet).")
@click.option("--state-dir", type=click.Path(file_okay=False), help="Supervisor state directory.")
@click.option("--readonly", is_flag=True, help="Watch only: no restart, stop or flush.")
@click.option(
    "--replay", type=click.Path(exists=True, file_okay=False), help="Replay a recorded state directory."
)
@click.option("--at", help="With --replay: the moment to start from.")
@click.option(
    "--interval", "--refresh", type=float, default=1.0, show_default=True, help="Seconds between polls."
)
def console(**options) -> None:
    """Open the operator console (TARGET: a profile to start, or the name of a running fleet)."""
    from console.client import SupervisorError, SupervisorUnavailable
    from console.tui.app import run

    try:
        code = run(**options)  # the options above are run()'s parameters, by name
    except SupervisorUnavailable as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_NO_FLEET)
    except (SupervisorError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    sys.exit(code or 0)


# ---------------------------------------------------------------- fleet


def _json_command():
    """The command class of `--json` commands: usage errors come out as JSON too (console/json_output.py)."""
    from console.json_output import JsonCommand

    return JsonCommand


def _maybe_json(json_mode: bool, impl, /, *args, **kwargs) -> int:
    """With --json, an error is printed as {"error": ...} too (console/json_output.py)."""
    if not json_mode:
        return impl(*args, **kwargs)
    from console.json_output import run_json

    return run_json(impl, *args, **kwargs)


def _fleet_options(fn):
    fn = click.option(
        "--state-dir", type=click.Path(file_okay=False), help="Supervisor state directory of the fleet."
    )(fn)
    fn = click.option("--fleet", "fleet", help="Fleet name (default: the only running fleet).")(fn)
    return fn


@main.command()
@click.argument("profile", type=click.Path(exists=True, dir_okay=False))
@click.option("-d", "--detach", is_flag=True, help="Return once the fleet is READY; leave it running.")
@click.option("--state-dir", type=click.Path(file_okay=False), help="Where the supervisor keeps its state.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for READY.")
def up(profile: str, detach: bool, state_dir: str | None, timeout: float) -> None:
    """Start the fleet a PROFILE describes, under a supervisor daemon."""
    from console.supervisor.ctl import up as do_up

    sys.exit(do_up(profile, detach=detach, state_dir=state_dir, timeout=timeout))


@main.command()
@_fleet_options
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds to wait for exit.")
def down(fleet: str | None, state_dir: str | None, timeout: float) -> None:
    """Stop every server of the fleet and the supervisor; no process is left behind."""
    from console.supervisor.ctl import down as do_down

    sys.exit(do_down(fleet, state_dir, timeout=timeout))


@main.command(cls=_json_command())
@_fleet_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(fleet: str | None, state_dir: str | None, as_json: bool) -> None:
    """Show each server's state, pid, port, restarts and last exit."""
    from console.supervisor.ctl import status as do_status

    sys.exit(_maybe_json(as_json, do_status, fleet, state_dir, as_json=as_json))


@main.command()
@_fleet_options
def ps(fleet: str | None, state_dir: str | None) -> None:
    """List the operating-system processes of the fleet (supervisor and servers)."""
    from console.supervisor.ctl import ps as do_ps

    sys.exit(do_ps(fleet, state_dir))


@main.command()
@click.argument("server")
@_fleet_options
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", type=int, default=100, show_default=True, help="Lines to show first.")
def logs(server: str, fleet: str | None, state_dir: str | None, follow: bool, lines: int) -> None:
    """Print the log of SERVER."""
    from console.supervisor.ctl import logs as do_logs

    sys.exit(do_logs(fleet, state_dir, server, follow=follow, lines=lines))


@main.command()
@click.argument("server", required=False)
@_fleet_options
@click.option("--all", "all_servers", is_flag=True, help="Restart every server.")
@click.option("--rolling", is_flag=True, help="With --all: one server at a time, each back READY first.")
def restart(server: str | None, fleet: str | None, state_dir: str | None, all_servers: bool, rolling: bool):
    """Restart SERVER, or every server with --all."""
    from console.supervisor.ctl import restart as do_restart

    if (server is None) == (not all_servers):
        raise click.UsageError("give either a SERVER name or --all")
    if rolling and not all_servers:
        raise click.UsageError("--rolling goes with --all")
    sys.exit(do_restart(fleet, state_dir, server, rolling=rolling))


@main.command(cls=_json_command())
@_fleet_options
@click.option("--dry-run", is_flag=True, help="Show what would change; apply nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def reload(fleet: str | None, state_dir: str | None, dry_run: bool, as_json: bool) -> None:
    """Re-read the fleet's profile and apply it: restart only the servers it changes, one at a time."""
    from console.supervisor.ctl import reload as do_reload

    sys.exit(_maybe_json(as_json, do_reload, fleet, state_dir, dry_run=dry_run, as_json=as_json))


# ---------------------------------------------------------------- monitoring


@main.command()
@_fleet_options
@click.option("--scrape-interval", default="5s", show_default=True, help="Prometheus scrape_interval.")
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False),
    help="File holding the servers' API key (profiles with api_key): sent as a Bearer token.",
)
def prometheus(fleet: str | None, state_dir: str | None, scrape_interval: str, api_key_file: str | None):
    """Print Prometheus scrape_configs for the fleet's servers and supervisor (file_sd, kept current)."""
    from console.monitoring.prometheus_config import fleet_state_dirs, scrape_configs
    from console.supervisor.paths import default_state_dir

    if state_dir or fleet:
        roots = [Path(state_dir).resolve() if state_dir else default_state_dir(fleet)]
    else:
        roots = fleet_state_dirs()
        if not roots:
            click.echo("error: no fleet has written Prometheus targets yet; start one with `tokenspeed up`, "
                       "or name it with --fleet NAME or --state-dir DIR", err=True)  # fmt: skip
            sys.exit(EXIT_NO_FLEET)
    try:
        config = scrape_configs(roots, scrape_interval, api_key_file)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(config, nl=False)


@main.command()
@click.option("--check", "check_url", metavar="PROMETHEUS_URL", help="Run every panel's query there instead.")
@click.option(
    "--fleet", default=".*", show_default=True, help="With --check: the fleet (a regex) to ask about."
)
@click.option(
    "--rate-window", default="1m", show_default=True, help="With --check: what $__rate_interval is."
)
def grafana(check_url: str | None, fleet: str, rate_window: str) -> None:
    """Print the Grafana dashboard (JSON) of TokenSpeed fleets: `tokenspeed grafana > dash.json`."""
    if check_url is None:
        from console.monitoring.grafana import render

        click.echo(render(), nl=False)
        return
    from console.monitoring.dashboard_check import check, format_answers

    answers = check(check_url, fleet, rate_window)
    click.echo(format_answers(answers))
    silent = [a for a in answers if a.error or not a.series]
    if silent:
        click.echo(f"error: {len(silent)} of {len(answers)} queries have no data", err=True)
    sys.exit(EXIT_FAILED if silent else EXIT_OK)


# ---------------------------------------------------------------- profiles


@main.group()
def profile() -> None:
    """Validate, show, plan and create fleet profiles."""


@profile.command("validate")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--no-preflight",
    is_flag=True,
    help="Check the profile alone, not whether it can start here (models found, ports free, state "
    "directory free): for a profile meant for another machine.",
)
def profile_validate(paths: tuple[str, ...], no_preflight: bool) -> None:
    """Check PROFILE files: every key, every server's resolved arguments, and what `up` would meet here
    (each model found, each port free, the state directory free), every problem at once."""
    from console.profile.cli import validate

    sys.exit(validate(list(paths), here=not no_preflight))


@profile.command("show", cls=_json_command())
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def profile_show(path: str, as_json: bool) -> None:
    """Show the servers a profile resolves to and the command line of each."""
    from console.profile.cli import show

    sys.exit(_maybe_json(as_json, show, path, as_json=as_json))


@profile.command("plan", cls=_json_command())
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--gpus-from",
    type=click.Path(exists=True, dir_okay=False),
    help="Plan against recorded GPU readings (JSON) instead of this machine's GPUs.",
)
@click.option(
    "--model-config",
    type=click.Path(exists=True, dir_okay=False),
    help="The model's config.json, when the model is not on this machine.",
)
def profile_plan(path: str, as_json: bool, gpus_from: str | None, model_config: str | None) -> None:
    """Size each server against the GPUs: memory, KV tokens, capture sizes; refuse what cannot fit."""
    from console.profile.cli import plan

    sys.exit(
        _maybe_json(as_json, plan, path, as_json=as_json, gpus_from=gpus_from, model_config=model_config)
    )


@profile.command("new")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--model", required=True, help="Model path or name for [server].model.")
@click.option("--name", help="Fleet name (default: the file name).")
@click.option("--replicas", type=int, default=1, show_default=True)
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor parallel size per replica.")
@click.option(
    "--device", type=click.Choice(["cuda", "cpu"]), default=None, help="Default: what the probe finds."
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def profile_new(path, model, name, replicas, tp, device, force) -> None:
    """Write a new profile for MODEL to PATH (sized for this machine)."""
    from console.profile.cli import new

    sys.exit(new(path, model=model, name=name, replicas=replicas, tp=tp, device=device, force=force))


if __name__ == "__main__":
    main()
