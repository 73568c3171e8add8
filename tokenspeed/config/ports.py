"""ZMQ addresses and the torch.distributed port of one server, derived from ``ServerArgs``.

Port cluster (TCP transport), counted from the distributed-init port P (``--dist-init-addr`` host:P, or
``--port`` + 233 on a single node), with the upstream offsets:

- P: torch.distributed init across nodes
- P+1: tokenizer (outputs back to the HTTP process)
- P+2: unused; skipped so the other offsets stay where external tooling expects them
- P+3: rpc (engine <-> scheduler calls)
- P+4: metrics (scheduler stats)
- P+5: scheduler input (the DP controller, or the only scheduler)
- P+6+r: scheduler input of attention-DP rank r (upstream used P+4+r, which collides with the metrics
  port for r=0 and the controller's input for r=1)

If any port of a cluster is taken (a previous server still in TIME_WAIT, say), the whole cluster moves
up by 10 until every port is free, so the offsets stay fixed relative to each other.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import socket
import tempfile
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tokenspeed.config.server_args import ServerArgs

ZMQ_TCP_PORT_DELTA = 233
_CLUSTER_STEP = 10
_MAX_PORT = 65535


def bind_error(port: int, host: str = "") -> OSError | None:
    """Why a TCP listener could not bind ``host:port`` now (None: it could). An empty host means every
    interface; an IPv6 address is probed over IPv6. The one "is this port free" of the tree."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR matches what ZMQ and uvicorn do: a port in TIME_WAIT is usable, one with a listener
        # is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def is_port_available(port: int, host: str = "") -> bool:
    """Whether a TCP listener could bind ``port`` now (on every interface when ``host`` is empty)."""
    return 0 < port <= _MAX_PORT and bind_error(port, host) is None


def split_host_port(addr: str) -> tuple[str, int]:
    """Parse ``--dist-init-addr`` (``host:port`` or ``[v6]:port``)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= _MAX_PORT:
        raise ValueError(
            f"--dist-init-addr must be host:port of the head node (e.g. 127.0.0.1:4000), got {addr!r}"
        )
    return host.strip("[]"), int(port)


def _free_nccl_port(http_port: int, taken: set[int]) -> int:
    # A random start keeps two servers started at once from racing for the same port; `taken` holds
    # this server's own ZMQ ports, which lie in the same range but are not bound yet.
    port = http_port + random.randint(100, 1000)
    while port in taken or not is_port_available(port):
        port = port + 42 if port < 60000 else port - 43
    return port


@dataclasses.dataclass
class PortArgs:
    """Where each process of one server listens; every address of the server comes from here."""

    # The HTTP process receives finished/streamed tokens from the scheduler here.
    tokenizer_ipc_name: str
    # Scheduler rank 0 (or the DP controller) receives requests here.
    scheduler_input_ipc_name: str
    # torch.distributed rendezvous port on a single node.
    nccl_port: int
    # Engine <-> scheduler control calls.
    rpc_ipc_name: str
    # Schedulers publish stats snapshots here.
    metrics_ipc_name: str
    tokenizer_worker_ipc_name: str | None = None
    # Private directory holding the ipc:// sockets (ipc transport only); remove with ``cleanup``.
    ipc_dir: str | None = None

    @staticmethod
    def init_new(
        server_args: ServerArgs, dp_rank: int | None = None, transport: Literal["tcp", "ipc"] = "tcp"
    ) -> PortArgs:
        """Pick free addresses for ``server_args``; ``dp_rank`` selects that DP rank's scheduler input.

        ``transport="ipc"`` puts the ZMQ sockets in a fresh 0700 temp directory instead of TCP ports; it
        only works when every process is on this node.
        """
        if transport == "ipc":
            return PortArgs._init_ipc(server_args, dp_rank)
        if transport != "tcp":
            raise ValueError(f"transport must be 'tcp' or 'ipc', got {transport!r}")
        mapping = server_args.mapping
        if mapping.nnodes == 1 and server_args.dist_init_addr is None:
            # DP ranks compute their scheduler ports independently, so they need an agreed base.
            if mapping.attn.has_dp:
                raise ValueError(
                    f"data parallel size {mapping.attn_dp_size} > 1 needs a fixed port base: pass "
                    "--dist-init-addr, e.g. --dist-init-addr 127.0.0.1:4000"
                )
            host, base = "127.0.0.1", server_args.port + ZMQ_TCP_PORT_DELTA
        elif server_args.dist_init_addr is None:
            raise ValueError(f"--nnodes {mapping.nnodes} needs --dist-init-addr host:port of the head node")
        else:
            host, base = split_host_port(server_args.dist_init_addr)
        while True:
            ports = _cluster(base, dp_rank)
            if mapping.nnodes > 1:
                # Worker nodes find the head's sockets at fixed offsets from --dist-init-addr, so the head
                # must never move them: a head that moved would leave its workers talking to nobody.
                if server_args.node_rank == 0:
                    _require_free(ports, server_args.dist_init_addr)
                break
            if all(is_port_available(p) for p in ports.values()):
                break
            base += _CLUSTER_STEP
            if base + 6 + (dp_rank or 0) > _MAX_PORT:
                raise ValueError(
                    "no free port cluster above the distributed-init port; choose a lower --dist-init-addr "
                    "port or --port"
                )
        nccl_port = _free_nccl_port(server_args.port, {server_args.port, *ports.values()})
        return PortArgs(
            tokenizer_ipc_name=f"tcp://{_url_host(host)}:{ports['tokenizer']}",
            scheduler_input_ipc_name=f"tcp://{_url_host(host)}:{ports['scheduler_input']}",
            nccl_port=nccl_port,
            rpc_ipc_name=f"tcp://{_url_host(host)}:{ports['rpc']}",
            metrics_ipc_name=f"tcp://{_url_host(host)}:{ports['metrics']}",
            tokenizer_worker_ipc_name=None,
        )

    @staticmethod
    def _init_ipc(server_args: ServerArgs, dp_rank: int | None) -> PortArgs:
        if server_args.mapping.nnodes != 1:
            raise ValueError("ipc transport only works on one node; use transport='tcp' with --nnodes > 1")
        ipc_dir = tempfile.mkdtemp(prefix="tokenspeed-ipc-")
        # mkdtemp already creates 0700; set it explicitly so a permissive umask policy cannot widen it.
        os.chmod(ipc_dir, 0o700)
        scheduler = "scheduler_input" if dp_rank is None else f"scheduler_input_dp{dp_rank}"
        return PortArgs(
            tokenizer_ipc_name=f"ipc://{ipc_dir}/tokenizer",
            scheduler_input_ipc_name=f"ipc://{ipc_dir}/{scheduler}",
            nccl_port=_free_nccl_port(server_args.port, {server_args.port}),
            rpc_ipc_name=f"ipc://{ipc_dir}/rpc",
            metrics_ipc_name=f"ipc://{ipc_dir}/metrics",
            ipc_dir=ipc_dir,
        )

    def cleanup(self) -> None:
        """Remove the private ipc directory, if this instance made one."""
        if self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)


def _cluster(base: int, dp_rank: int | None) -> dict[str, int]:
    ports = {
        "dist_init": base,
        "tokenizer": base + 1,
        "rpc": base + 3,
        "metrics": base + 4,
        "scheduler_input": base + 5 if dp_rank is None else base + 6 + dp_rank,
    }
    return ports


def fixed_ports(server_args: ServerArgs) -> dict[str, int]:
    """The ports a server's head process binds exactly where they are, by name: with ``--dist-init-addr``
    its whole cluster (it never moves: the other nodes and DP ranks find it there). Without it the cluster
    moves up to free ports by itself, so none is fixed (the HTTP ``--port`` aside)."""
    if server_args.dist_init_addr is None:
        return {}
    _host, base = split_host_port(server_args.dist_init_addr)
    ports = _cluster(base, None)
    mapping = server_args.mapping
    if mapping.attn.has_dp:
        ports.update({f"scheduler_input_dp{r}": base + 6 + r for r in range(mapping.attn_dp_size)})
    return ports


def _require_free(ports: dict[str, int], dist_init_addr: str) -> None:
    taken = [f"{port} ({name})" for name, port in ports.items() if not is_port_available(port)]
    if taken:
        raise ValueError(
            f"--dist-init-addr {dist_init_addr}: port(s) {', '.join(taken)} already in use on the head node; "
            "every node derives its addresses from that port, so pass another --dist-init-addr port (the "
            "same on every node) whose next few ports are free on the head"
        )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
