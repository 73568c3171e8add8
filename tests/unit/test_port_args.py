"""``PortArgs``: distinct free ports, the --dist-init-addr layout, moving past taken ports, ipc dirs."""

from __future__ import annotations

import os
import socket
import stat
from urllib.parse import urlsplit

import pytest

from tokenspeed.config.cli import prepare_server_args
from tokenspeed.config.ports import ZMQ_TCP_PORT_DELTA, PortArgs, is_port_available, split_host_port
from tokenspeed.config.resolve import PlatformFacts

NO_GPU = PlatformFacts("cpu")


def args(*argv: str):
    return prepare_server_args(["MODEL", *argv], platform=NO_GPU)


def free_base(span: int = 40) -> int:
    """A port P with P..P+span free, so the layout lands exactly on P."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + span < 65000 and all(is_port_available(p) for p in range(base, base + span)):
            return base


def tcp_ports(port_args: PortArgs) -> list[int]:
    names = [
        port_args.tokenizer_ipc_name,
        port_args.scheduler_input_ipc_name,
        port_args.rpc_ipc_name,
        port_args.metrics_ipc_name,
    ]
    return [urlsplit(n).port for n in names]


def test_single_node_ports_are_distinct_and_free():
    port_args = PortArgs.init_new(args("--port", str(free_base())))
    ports = [*tcp_ports(port_args), port_args.nccl_port]
    assert len(set(ports)) == len(ports)
    assert all(is_port_available(p) for p in ports)
    assert all(
        n.startswith("tcp://127.0.0.1:") for n in (port_args.tokenizer_ipc_name, port_args.rpc_ipc_name)
    )


def test_single_node_layout_follows_http_port():
    http = free_base(ZMQ_TCP_PORT_DELTA + 20)
    port_args = PortArgs.init_new(args("--port", str(http)))
    base = http + ZMQ_TCP_PORT_DELTA
    assert tcp_ports(port_args) == [base + 1, base + 5, base + 3, base + 4]


@pytest.mark.parametrize(("dp_rank", "scheduler_offset"), [(None, 5), (0, 6), (1, 7), (3, 9)])
def test_dist_init_addr_layout(dp_rank, scheduler_offset):
    base = free_base()
    server = args("--tp", "2", "--data-parallel-size", "4", "--dist-init-addr", f"127.0.0.1:{base}")
    port_args = PortArgs.init_new(server, dp_rank=dp_rank)
    assert tcp_ports(port_args) == [base + 1, base + scheduler_offset, base + 3, base + 4]


def test_dp_ranks_never_share_a_port():
    base = free_base()
    server = args("--data-parallel-size", "4", "--dist-init-addr", f"127.0.0.1:{base}")
    controller = PortArgs.init_new(server)
    ranks = [PortArgs.init_new(server, dp_rank=r) for r in range(4)]
    inputs = [controller.scheduler_input_ipc_name] + [p.scheduler_input_ipc_name for p in ranks]
    shared = {controller.tokenizer_ipc_name, controller.rpc_ipc_name, controller.metrics_ipc_name}
    assert len(set(inputs)) == 5 and not shared & set(inputs)


def test_taken_port_moves_the_whole_cluster():
    base = free_base()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 3))
        taken.listen(1)
        assert not is_port_available(base + 3)
        port_args = PortArgs.init_new(args("--dist-init-addr", f"127.0.0.1:{base}"))
    assert tcp_ports(port_args) == [base + 11, base + 15, base + 13, base + 14]


def test_multi_node_head_refuses_a_taken_port_instead_of_moving():
    # Workers compute the same fixed offsets, so a head that moved would never hear from them.
    base = free_base()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 3))
        taken.listen(1)
        head = args("--tp", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{base}")
        with pytest.raises(ValueError, match=rf"--dist-init-addr .*{base + 3} \(rpc\)"):
            PortArgs.init_new(head)
        worker = args(
            "--tp", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{base}"
        )
        assert tcp_ports(PortArgs.init_new(worker)) == [base + 1, base + 5, base + 3, base + 4]
    assert tcp_ports(PortArgs.init_new(head)) == [base + 1, base + 5, base + 3, base + 4]


def test_remote_head_host_is_used():
    base = free_base()
    port_args = PortArgs.init_new(
        args("--tp", "8", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", f"10.1.2.3:{base}")
    )
    assert port_args.tokenizer_ipc_name == f"tcp://10.1.2.3:{base + 1}"


def test_dp_without_dist_init_addr_is_an_error():
    with pytest.raises(ValueError, match="--dist-init-addr"):
        PortArgs.init_new(args("--data-parallel-size", "2"))


@pytest.mark.parametrize("addr", ["localhost", "host:", ":4000", "host:port", "host:70000"])
def test_bad_dist_init_addr(addr):
    with pytest.raises(ValueError, match="--dist-init-addr"):
        split_host_port(addr)


def test_ipv6_dist_init_addr():
    assert split_host_port("[::1]:4000") == ("::1", 4000)
    base = free_base()
    port_args = PortArgs.init_new(args("--dist-init-addr", f"[::1]:{base}"))
    assert port_args.rpc_ipc_name == f"tcp://[::1]:{base + 3}"


def test_ipc_transport_uses_a_private_directory():
    port_args = PortArgs.init_new(args(), transport="ipc")
    try:
        mode = stat.S_IMODE(os.stat(port_args.ipc_dir).st_mode)
        assert mode == 0o700
        for name in (
            port_args.tokenizer_ipc_name,
            port_args.scheduler_input_ipc_name,
            port_args.rpc_ipc_name,
        ):
            assert name.startswith(f"ipc://{port_args.ipc_dir}/")
        assert is_port_available(port_args.nccl_port)
    finally:
        port_args.cleanup()
    assert not os.path.exists(port_args.ipc_dir)


def test_ipc_transport_is_single_node():
    server = args("--tp", "2", "--nnodes", "2", "--dist-init-addr", "10.0.0.1:5000")
    with pytest.raises(ValueError, match="one node"):
        PortArgs.init_new(server, transport="ipc")


def test_is_port_available_sees_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert not is_port_available(s.getsockname()[1])
    assert not is_port_available(0) and not is_port_available(70000)


def test_the_nccl_port_never_lands_on_the_servers_own_zmq_ports(monkeypatch):
    """The rendezvous port starts at a random offset 100..1000 above --port, where the ZMQ ports
    (--port + 233 + 1..5) lie too: one of them, not yet bound, must never be picked."""
    import tokenspeed.config.ports as ports_mod

    http = free_base(ZMQ_TCP_PORT_DELTA + 20)
    monkeypatch.setattr(ports_mod.random, "randint", lambda lo, hi: ZMQ_TCP_PORT_DELTA + 1)
    port_args = PortArgs.init_new(args("--port", str(http)))
    assert port_args.nccl_port not in tcp_ports(port_args) + [http]
