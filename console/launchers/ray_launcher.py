"""The Ray launcher: one agent actor per node starts that node's `tokenspeed serve --node-rank i`.

The supervisor stays the only decision maker; an agent only starts, polls and signals processes on
its node and hands back their log bytes. Agents are detached named actors, so a supervisor that
crashes finds them (and the servers they run) again: `adopt()` looks the agent up by name.

Nodes are matched by address: `[fleet] nodes` lists Ray node IPs, head first. Several Ray nodes on
one address (a local test cluster) are taken in order, head node first.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from console.launchers.base import Launcher, ProcessHandle
from console.profile.schema import ProcessSpec, ServerSpec
from console.supervisor.logfile import append
from console.supervisor.states import ExitInfo

NAMESPACE = "tokenspeed"
RAY_CALL_TIMEOUT_S = 10.0


class NodeAgent:
    """Runs on one Ray node (as an actor): the processes of that node, by key `server/rank`."""

    def __init__(self, log_dir: str):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict = {}

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def start(self, key: str, argv: list[str], env: dict[str, str]) -> dict:
        import subprocess

        import psutil

        log_path = self.log_dir / (key.replace("/", "-") + ".log")
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
                close_fds=True,
            )
        create_time = psutil.Process(popen.pid).create_time()
        self.procs[key] = {"popen": popen, "log": str(log_path), "offset": log_path.stat().st_size}
        return {"pid": popen.pid, "create_time": create_time}

    def poll(self, key: str) -> dict | None:
        """None while running; {"returncode"} once ended (None if this agent never started it)."""
        entry = self.procs.get(key)
        if entry is None:
            return {"returncode": None}
        code = entry["popen"].poll()
        if code is None:
            return None
        _killpg(entry["popen"].pid, signal.SIGKILL)
        return {"returncode": code}

    def signal(self, key: str, signum: int) -> None:
        entry = self.procs.get(key)
        if entry is not None and entry["popen"].poll() is None:
            _killpg(entry["popen"].pid, signum)

    def read_log(self, key: str, limit: int = 1 << 20) -> bytes:
        """Log bytes written since the last call."""
        entry = self.procs.get(key)
        if entry is None:
            return b""
        with open(entry["log"], "rb") as f:
            f.seek(entry["offset"])
            data = f.read(limit)
        entry["offset"] += len(data)
        return data

    def running(self) -> list[str]:
        return [k for k, e in self.procs.items() if e["popen"].poll() is None]


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(eq=False)  # a handle is one process: compared by identity, as the local ones
class RayHandle(ProcessHandle):
    agent: Any  # the node's NodeAgent actor
    agent_name: str
    key: str  # `server/node_rank`: the name its agent knows the process by
    node_rank: int
    pid: int
    create_time: float

    def poll(self) -> ExitInfo | None:
        import ray

        try:
            result = ray.get(self.agent.poll.remote(self.key), timeout=RAY_CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return ExitInfo(None, None, time.time(), "its Ray node or agent is gone; exit status unknown")
        if result is None:
            return None
        return ExitInfo.from_returncode(result["returncode"], time.time())

    def signal_group(self, sig: signal.Signals) -> None:
        import ray

        try:
            ray.get(self.agent.signal.remote(self.key, int(sig)), timeout=RAY_CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass

    def record(self) -> dict:
        return {
            "pid": self.pid,
            "create_time": self.create_time,
            "node_rank": self.node_rank,
            "agent": self.agent_name,
            "key": self.key,
        }


class RayLauncher(Launcher):
    def __init__(self, command: tuple[str, ...] | None, state_dir: Path, address: str | None = None):
        super().__init__(command)
        import ray

        if not ray.is_initialized():
            ray.init(
                address=address or os.environ.get("RAY_ADDRESS", "auto"),
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level="WARNING",
            )
        self.fleet_id = state_dir.name
        self._agents: dict[str, object] = {}
        self._node_ids: list[tuple[str, str]] | None = None
        self._handles: dict[str, tuple[RayHandle, Path]] = {}

    def _ray_nodes(self) -> list[tuple[str, str]]:
        """(address, node id) of alive Ray nodes, head node first."""
        import ray

        nodes = [n for n in ray.nodes() if n["Alive"]]
        nodes.sort(key=lambda n: "node:__internal_head__" not in n["Resources"])
        return [(n["NodeManagerAddress"], n["NodeID"]) for n in nodes]

    def _node_for(self, server: ServerSpec, process: ProcessSpec) -> str:
        """The Ray node id running `process`: the k-th Ray node with that address, k counted over the
        addresses of the server's nodes up to this one."""
        nodes = self._ray_nodes()
        earlier = [p.node for p in server.processes[: process.node_rank]].count(process.node)
        matching = [node_id for address, node_id in nodes if address == process.node]
        if earlier >= len(matching):
            known = ", ".join(sorted({a for a, _ in nodes})) or "none"
            raise RuntimeError(
                f"no Ray node with address {process.node} for node rank {process.node_rank} (alive: {known})"
            )
        return matching[earlier]

    def _agent(self, node_id: str):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = f"tokenspeed-agent-{self.fleet_id}-{node_id[:12]}"
        if name not in self._agents:
            actor_cls = ray.remote(num_cpus=0, max_concurrency=4)(NodeAgent)
            log_dir = os.path.join("/tmp", f"tokenspeed-agent-{self.fleet_id}")
            self._agents[name] = actor_cls.options(
                name=name,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(log_dir)
        return name, self._agents[name]

    def start(self, server: ServerSpec, process: ProcessSpec, log_path: Path) -> ProcessHandle:
        import ray

        name, agent = self._agent(self._node_for(server, process))
        key = f"{server.name}/{process.node_rank}"
        env = {**dict(process.env), "TOKENSPEED_SERVER_NAME": server.name}
        ident = ray.get(agent.start.remote(key, [*self.command, *process.argv], env), timeout=60)
        handle = RayHandle(agent, name, key, process.node_rank, ident["pid"], ident["create_time"])
        self._handles[key] = (handle, log_path)
        return handle

    def adopt(
        self, server: ServerSpec, process: ProcessSpec, record: dict, log_path: Path
    ) -> ProcessHandle | None:
        import ray

        if "agent" not in record:
            return None
        try:
            agent = ray.get_actor(record["agent"], namespace=NAMESPACE)
            if ray.get(agent.poll.remote(record["key"]), timeout=RAY_CALL_TIMEOUT_S) is not None:
                return None
        except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return None
        self._agents[record["agent"]] = agent
        handle = RayHandle(
            agent, record["agent"], record["key"], process.node_rank, record["pid"], record["create_time"]
        )
        self._handles[record["key"]] = (handle, log_path)
        return handle

    def poll_logs(self) -> None:
        """Copy what each node's processes logged into the server's local log file."""
        import ray

        for key, (handle, log_path) in list(self._handles.items()):
            try:
                data = ray.get(handle.agent.read_log.remote(key), timeout=RAY_CALL_TIMEOUT_S)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                self._handles.pop(key, None)
                continue
            if data:
                append(log_path, data)

    def close(self) -> None:
        """Called once every server is stopped: the agents have nothing left to run."""
        import ray

        self.poll_logs()
        for agent in self._agents.values():
            try:
                if not ray.get(agent.running.remote(), timeout=RAY_CALL_TIMEOUT_S):
                    ray.kill(agent)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
        ray.shutdown()
