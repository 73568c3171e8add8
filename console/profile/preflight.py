"""Pre-flight: what would make a fleet fail once started, found before anything starts, all at once.

    report = preflight("fleet.toml", state_dir=None)
    for problem in report.problems: print(problem)      # file:line: [table] key: what is wrong; the fix

`profile validate`, `profile plan`, `up` and the console (its start and its profile screen) run it. It
reports, together:
- every mistake the loader finds (console.profile.validate: one pass per wrong line);
- each model that cannot be found here: neither a demo model name nor a local folder with config.json
  (a server would crash-loop on it; TokenSpeed never downloads);
- each port a server will bind that something already holds: the HTTP port (`[fleet] base_port`) and,
  with a rendezvous address, the fixed port cluster (`[fleet] dist_init_port`), with what holds it and a
  base port that is free;
- a state directory (the fleet's name, without --state-dir) in use by another running fleet.

A fleet that already runs from this very profile and state directory is no problem (`up` attaches to it),
nor are the ports of servers a killed supervisor left running (the next supervisor re-adopts them).
Models are checked only where `tokenspeed serve` starts on this machine (the local launcher, no
`[fleet] command` of its own); ports only on this machine's nodes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from console.profile.toml import ProfileError, RawProfile, did_you_mean, read_profile

if TYPE_CHECKING:
    from console.profile.fleet import ResolvedFleet

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_SERVE = ("tokenspeed", "serve")


@dataclass(frozen=True)
class Preflight:
    problems: tuple[ProfileError, ...]
    # The fleet the profile resolves to (None when even the copy without the wrong lines does not load).
    resolved: ResolvedFleet | None
    # This very fleet already runs from the state directory: `up` attaches to it instead of starting.
    running: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


def preflight(
    path: str | Path,
    state_dir: str | Path | None = None,
    *,
    models: bool = True,
    here: bool = True,
    real_path: str | Path | None = None,
) -> Preflight:
    """Every problem of the profile at `path`. `models`: check that each model is found here; `here`:
    check ports and the state directory on this machine. `real_path`: the file `path` stands in for (the
    console checks its editor's text as a copy): the identity of a running fleet, the path errors name."""
    from console.profile.validate import load_all

    source = Path(path).resolve()
    real = Path(real_path).resolve() if real_path is not None else source
    problems, resolved = load_all(source)
    raw = _raw(source)
    if raw is not None and models:
        problems += _model_problems(raw)
    running = False
    if resolved is not None and here and raw is not None:
        directory = _state_dir(resolved, state_dir, real)
        problem, running = _state_problem(raw, directory, real)
        problems += [problem] if problem else []
        if not running:
            problems += _port_problems(raw, resolved, directory)
    problems = [_relabel(p, source, real) for p in problems]
    # the loader and a check may find the same line
    unique = list({(str(p.path), p.line, str(p)): p for p in problems}.values())
    unique.sort(key=lambda e: (str(e.path), e.line is None, e.line or 0))  # lineless ones last, as load_all
    return Preflight(tuple(unique), resolved, running)


def preflight_text(text: str, real_path: str | Path, **options) -> Preflight:
    """`preflight` of profile text not saved yet (the console's editor), as if it were `real_path`: a copy
    under the same file name (a fleet without [fleet] name is named after it), `extends` made absolute."""
    from console.profile.validate import _absolute_extends

    real = Path(real_path).resolve()
    lines = _absolute_extends(text.splitlines(), real.parent)
    with tempfile.TemporaryDirectory(prefix="tokenspeed-preflight-") as tmp:
        copy = Path(tmp) / real.name
        copy.write_text("\n".join(lines) + "\n")
        return preflight(copy, real_path=real, **options)


def _raw(path: Path) -> RawProfile | None:
    try:
        return read_profile(path)
    except ProfileError:
        return None  # not TOML, a missing `extends`: the loader's errors say so


def _relabel(problem: ProfileError, source: Path, real: Path) -> ProfileError:
    if source == real:
        return problem
    path = real if problem.path is not None and Path(problem.path) == source else problem.path
    return ProfileError(problem.message.replace(str(source), str(real)), path, problem.line, problem.key)


# ------------------------------------------------------------------ models


def _serves_here(raw: RawProfile) -> bool:
    """Servers that `tokenspeed serve` starts on this machine: only then is the model theirs to find here."""
    fleet = raw.data.get("fleet")
    fleet = fleet if isinstance(fleet, dict) else {}
    command = fleet.get("command")
    if isinstance(command, list) and tuple(command[-2:]) != _SERVE:
        return False
    nodes = fleet.get("nodes", ["127.0.0.1"])
    return fleet.get("launcher", "local") == "local" or (
        isinstance(nodes, list) and all(n in _LOOPBACK for n in nodes)
    )


def model_problem(model: str) -> str | None:
    """Why `model` cannot be served here (with the fix), or None when it can."""
    from tokenspeed.demo_models import demo_model_names, demo_model_path, is_demo_model

    names = ", ".join(demo_model_names())
    if is_demo_model(model):
        try:
            demo_model_path(model)
        except ValueError as exc:
            return str(exc)
        return None
    folder = Path(model).expanduser()
    if folder.is_dir():
        if (folder / "config.json").is_file():
            return None
        return (
            f"the folder {folder.resolve()} has no config.json: point it at a Hugging Face model folder "
            "(config.json, *.safetensors, tokenizer files)"
        )
    hint = did_you_mean(model, demo_model_names())
    where = "" if folder.is_absolute() else f" (a relative path is taken from {Path.cwd()})"
    return (
        f"{model!r} is neither a demo model ({names}) nor a local folder with config.json{where}{hint}; "
        "TokenSpeed does not download models: set a demo name or the folder the model was downloaded to"
    )


def _model_keys() -> set[str]:
    from console.profile.server import _aliases

    return {"model", *(alias for alias, field in _aliases().items() if field == "model")}


def _model_problems(raw: RawProfile) -> list[ProfileError]:
    if not _serves_here(raw):
        return []
    keys = _model_keys()
    server = raw.data.get("server")
    server = server if isinstance(server, dict) else {}
    groups = raw.data.get("groups")
    groups = {n: t for n, t in groups.items() if isinstance(t, dict)} if isinstance(groups, dict) else {}
    places = [(f"groups.{name}", table) for name, table in groups.items()]
    if not groups or any(not keys & set(table) for table in groups.values()):
        places.insert(0, ("server", server))  # some server takes [server]'s model
    problems = []
    for table_name, table in places:
        for key in sorted(keys & set(table)):
            value = table[key]
            why = model_problem(value) if isinstance(value, str) else None
            if why:
                problems.append(raw.error(table_name, key, why))
    return problems


# ------------------------------------------------------------------ state directory


def _state_dir(resolved: ResolvedFleet, state_dir: str | Path | None, real: Path) -> Path:
    from console.supervisor.paths import default_state_dir

    if state_dir is not None:
        return Path(state_dir).resolve()
    name = resolved.profile.fleet.name
    return default_state_dir(name)


def _state_problem(raw: RawProfile, directory: Path, real: Path) -> tuple[ProfileError | None, bool]:
    """(the problem, None if none; whether this very fleet runs there already)."""
    from console.client import SupervisorClient, SupervisorError

    with SupervisorClient(directory, timeout=2.0) as client:
        if not client.alive():
            return None, False
        try:
            data = client.fleet()
        except SupervisorError:
            data = {}
    theirs = data.get("profile_path")
    if theirs and Path(theirs).resolve() == real:
        return None, True
    name = data.get("name") or directory.name
    message = (
        f"the state directory {directory} is in use by running fleet {name!r} (profile {theirs or 'unknown'}): "
        f"give this fleet another [fleet] name or --state-dir, or stop that one first "
        f"(`tokenspeed down --state-dir {directory}`)"
    )
    return raw.error("fleet", "name", message), False


# ------------------------------------------------------------------ ports


def _port_problems(raw: RawProfile, resolved: ResolvedFleet, directory: Path) -> list[ProfileError]:
    from console.gpu_owners import recorded_fleet
    from tokenspeed.config.ports import bind_error, fixed_ports

    leftover = recorded_fleet(directory)
    adopted = set(leftover.servers) if leftover is not None else set()  # re-adopted with their ports
    host = resolved.profile.fleet.host
    problems = []
    taken_http = False
    for spec, args in zip(resolved.servers, resolved.server_args, strict=True):
        if spec.name in adopted or spec.processes[0].node not in _LOOPBACK:
            continue
        wanted = [(spec.port, "HTTP port", "base_port")]
        wanted += [(port, f"{what} port", "dist_init_port") for what, port in fixed_ports(args).items()]
        for port, what, key in wanted:
            if bind_error(port, host) is None:
                continue
            taken_http = taken_http or key == "base_port"
            fix = (
                f"set [fleet] {key} to ports that are free"
                if key == "dist_init_port"
                else "set [fleet] base_port to a free range" + _free_base(resolved, host)
            )
            message = (
                f"port {port} ({spec.name}'s {what}) is {port_holder(port)}: {fix}, or stop what holds it"
            )
            problems.append(raw.error("fleet", key, message))
    return problems


def _free_base(resolved: ResolvedFleet, host: str) -> str:
    """` (e.g. base_port = N)`: the next base port above this one where every server's HTTP port is free."""
    from tokenspeed.config.ports import is_port_available

    base = resolved.profile.fleet.base_port
    offsets = [spec.port - base for spec in resolved.servers]
    for candidate in range(base + 100, 65000 - max(offsets, default=0), 10):
        if all(is_port_available(candidate + o, host) for o in offsets):
            return f" (e.g. base_port = {candidate})"
    return ""


def port_holder(port: int) -> str:
    """`in use by server demo-0 of running fleet 'demo' (pid 12)`, `in use by pid 12 (python3)`, or as
    little as can be known (another user's process hides its pid)."""
    import psutil

    from console.gpu_owners import other_fleets

    try:
        pids = {
            c.pid
            for c in psutil.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        }
    except (psutil.Error, OSError):
        pids = set()
    if not pids:
        return "in use by another process"
    groups = {pid: _group(pid) for pid in pids}
    for fleet in other_fleets(None):
        for server, roots in fleet.servers.items():
            owner = next((pid for pid, group in groups.items() if group in roots or pid in roots), None)
            if owner is not None:
                return (
                    f"in use by server {server} of running fleet {fleet.name!r} (pid {owner}; "
                    f"`tokenspeed down --fleet {fleet.name}` stops it)"
                )
    pid = min(pids)
    try:
        name = " ".join(" ".join(psutil.Process(pid).cmdline()).split()) or psutil.Process(pid).name()
    except psutil.Error:
        name = "?"
    return f"in use by pid {pid} ({name[:80]})"


def _group(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return os.getpgid(pid)
    return None
