"""The main loop of a scheduler process: requests in over ZMQ, `EngineCore.step()`, outputs and stats out.

One process per rank. The loop never blocks while the engine has work; idle, it sleeps in `poll` so a new
request wakes it at once. It exits when the parent dies, on SIGTERM, or (non-zero) when the engine raises:
a broken rank must take the server down, never leave it hanging.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch
import zmq

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.runtime.distributed.rank_engine import PeerEngine, build_rank_engine, needs_group_peers
from tokenspeed.runtime.engine.endpoints import ServerEndpoints
from tokenspeed.runtime.engine.engine_core import EngineCore
from tokenspeed.runtime.engine.engine_protocol import EngineProtocol
from tokenspeed.runtime.engine.io_struct import (
    AbortRequest,
    BatchOutput,
    ControlRefused,
    FlushCacheRequest,
    GenerateRequest,
    ReadyMessage,
    RequestOutput,
    RpcRequest,
    RpcResponse,
    StartupFailed,
    StatsSnapshot,
    decode,
    encode,
)
from tokenspeed.runtime.engine.process_watchdog import StopFlag, die_with_parent, parent_alive
from tokenspeed.runtime.engine.rank_info import RankInfo, configure_child_logging
from tokenspeed.runtime.engine.scheduler_liveness import HEARTBEAT_S
from tokenspeed.runtime.startup_phases import StartupPhases, process_started_at

logger = logging.getLogger("tokenspeed.scheduler")

_IDLE_POLL_MS = 50
# The front end's /metrics needs fresh numbers, not every step's: stats go to it at most this often.
_FRONTEND_STATS_INTERVAL_S = 0.1


@dataclass
class _StatsPacer:
    """Accumulates per-step token counts between snapshots, sends to the front end and the DP controller."""

    load_interval: float
    last_frontend: float = 0.0
    last_load: float = 0.0
    last_key: tuple = ()
    iteration_tokens: list[int] = field(default_factory=list)
    latest: StatsSnapshot | None = None


def build_engine(server_args: ServerArgs, info: RankInfo, nccl_port: int = 0) -> EngineProtocol | PeerEngine:
    """The engine of this rank; the device index comes from the rank's placement.

    With TP/EP peers or MoE expert management it is built by tokenspeed.runtime.distributed.rank_engine: the
    EngineCore leading its peers on rank 0 of a TP group, a `PeerEngine` on the others.
    """
    device = None
    if server_args.device == "cuda":
        device = f"cuda:{info.gpu_id}"
    elif server_args.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # The HTTP process needs a core of its own, and several CPU ranks must not each grab every core:
        # an OpenMP team that spans busy cores spin-waits (on 2 cores, 2 threads made decode ~15x slower
        # than 1 under load).
        torch.set_num_threads(max(1, ((os.cpu_count() or 1) - 1) // info.num_local_ranks))
    if needs_group_peers(server_args):
        return build_rank_engine(server_args, info.rank, info.dp_rank, device, nccl_port)
    return EngineCore(server_args, dp_rank=info.dp_rank, device=device)


def run_scheduler_process(
    server_args: ServerArgs, endpoints: ServerEndpoints, info: RankInfo, parent_pid: int
) -> None:
    """Entry point of a spawned scheduler process."""
    die_with_parent(parent_pid)
    stop = StopFlag().install()
    configure_child_logging(server_args, f"dp{info.dp_rank} tp{info.tp_rank}")
    try:
        code = _serve(server_args, endpoints, info, parent_pid, stop)
    except Exception:
        logger.error("scheduler dp%d tp%d failed:\n%s", info.dp_rank, info.tp_rank, traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: torch and zmq finalizers can hang a dying process


def startup_phases(entered: float, engine_phases: dict[str, float]) -> dict[str, float]:
    """This rank's start-up in seconds: the process's start and imports (until `entered`, a time.time()),
    the engine's own phases (device, process group, model config, weights, KV cache, ...), and "other",
    what none of them covers."""
    began = process_started_at()
    phases = StartupPhases()
    phases.add("process start and imports", entered - began)
    for name, seconds in engine_phases.items():
        phases.add(name, seconds)
    return phases.summary(time.time() - began)


def _serve(
    server_args: ServerArgs, endpoints: ServerEndpoints, info: RankInfo, parent_pid: int, stop: StopFlag
) -> int:
    ctx = zmq.Context(io_threads=1)
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.SNDHWM, 0)
    out.setsockopt(zmq.LINGER, 2000)
    out.connect(endpoints.output)
    inp = None
    load = None
    if info.tp_rank == 0:
        inp = ctx.socket(zmq.PULL)
        inp.setsockopt(zmq.RCVHWM, 0)
        inp.bind(endpoints.rank_inputs[info.dp_rank])
        if endpoints.load is not None:
            load = ctx.socket(zmq.PUSH)
            load.setsockopt(zmq.SNDHWM, 0)
            load.setsockopt(zmq.LINGER, 0)
            load.connect(endpoints.load)

    entered = time.time()
    try:
        engine = build_engine(server_args, info, endpoints.nccl_port)
    except Exception as exc:
        # The front end waits for this rank's ReadyMessage: say why none will come, so its error names the
        # cause (a flag the model cannot take, a missing file), not only an exit code. The traceback is
        # logged by run_scheduler_process.
        out.send(
            encode(StartupFailed(dp_rank=info.dp_rank, tp_rank=info.tp_rank, error=str(exc) or repr(exc)))
        )
        for s in (inp, load):
            if s is not None:
                s.close(linger=0)
        out.close(linger=2000)
        ctx.term()  # returns once that message is out (or 2 s passed): os._exit skips zmq's teardown
        raise
    out.send(
        encode(
            ReadyMessage(
                dp_rank=info.dp_rank,
                tp_rank=info.tp_rank,
                max_total_tokens=int(engine.max_total_tokens),
                max_req_input_len=int(engine.max_req_input_len),
                max_model_len=int(engine.max_model_len),
                startup=startup_phases(entered, engine.startup_seconds),
            )
        )
    )
    logger.info(
        "ready: max_total_tokens=%s max_model_len=%s max_req_input_len=%s",
        engine.max_total_tokens,
        engine.max_model_len,
        engine.max_req_input_len,
    )
    if isinstance(engine, PeerEngine):
        engine.follow()  # a TP peer: runs its rank 0's steps until that rank shuts down
        return 0
    assert inp is not None, "rank 0 of a TP group builds the leading engine"

    pacer = _StatsPacer(load_interval=float(server_args.load_watch_interval or 0.02))
    decode_log_interval = int(server_args.decode_log_interval or 0)
    steps = 0
    try:
        while not stop.is_set():
            if not parent_alive(parent_pid):
                logger.error("parent process %d is gone; exiting", parent_pid)
                return 1
            busy = engine.has_unfinished()
            if inp.poll(0 if busy else _IDLE_POLL_MS):
                _drain_inputs(inp, out, engine, info)
            if engine.has_unfinished():
                outputs = engine.step()
                steps += 1
                if outputs:
                    for o in outputs:
                        o.dp_rank = info.dp_rank
                    out.send(encode(BatchOutput(outputs=list(outputs))))
                if decode_log_interval and steps % decode_log_interval == 0 and pacer.latest is not None:
                    _log_progress(pacer.latest)
            _send_stats(engine, info, out, load, pacer)
    finally:
        engine.shutdown()
        for s in (inp, out, load):
            if s is not None:
                s.close(linger=0)
        ctx.term()
    return 0


def _drain_inputs(inp: zmq.Socket, out: zmq.Socket, engine: EngineProtocol, info: RankInfo) -> None:
    while True:
        try:
            raw = inp.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            msg = decode(raw)
        except Exception as exc:  # a malformed message must not kill the rank
            logger.error("dropping undecodable message: %s", exc)
            continue
        if isinstance(msg, GenerateRequest):
            try:
                engine.add_request(msg)
            except ValueError as exc:
                fail = RequestOutput(
                    rid=msg.rid,
                    new_token_ids=[],
                    finished=True,
                    finish_reason="abort",
                    prompt_tokens=len(msg.input_ids),
                    error=str(exc),
                    dp_rank=info.dp_rank,
                )
                out.send(encode(BatchOutput(outputs=[fail])))
        elif isinstance(msg, AbortRequest):
            engine.abort_request(msg.rid)
        elif isinstance(msg, FlushCacheRequest):
            engine.flush_cache()
        elif isinstance(msg, RpcRequest):
            out.send(encode(_handle_rpc(engine, msg, info)))
        else:
            logger.error("unexpected message %s on the scheduler input", type(msg).__name__)


def _handle_rpc(engine: EngineProtocol, req: RpcRequest, info: RankInfo) -> RpcResponse:
    """Control calls: flush_cache and stats here, the others by name through `engine.control`."""
    try:
        if req.method == "flush_cache":
            ok = engine.flush_cache()
            return RpcResponse(call_id=req.call_id, ok=ok is not False, result={"dp_rank": info.dp_rank})
        if req.method == "stats":
            return RpcResponse(call_id=req.call_id, ok=True, result=_snapshot_dict(engine.stats(), info))
        return RpcResponse(call_id=req.call_id, ok=True, result=engine.control(req.method, dict(req.args)))
    except ControlRefused as exc:
        logger.info("control call %s refused: %s", req.method, exc)
        return RpcResponse(call_id=req.call_id, ok=False, error=str(exc), refused=exc.code)
    except Exception as exc:
        logger.error("control call %s failed: %s", req.method, exc)
        return RpcResponse(call_id=req.call_id, ok=False, error=f"{req.method} failed: {exc}")


def _snapshot_dict(snap: StatsSnapshot, info: RankInfo) -> dict:
    snap.dp_rank = info.dp_rank
    return {k: getattr(snap, k) for k in snap.__dataclass_fields__}


def _send_stats(engine: EngineProtocol, info: RankInfo, out: zmq.Socket, load: zmq.Socket | None, pacer: _StatsPacer):
    now = time.monotonic()
    due_load = load is not None and now - pacer.last_load >= pacer.load_interval
    due_front = now - pacer.last_frontend >= _FRONTEND_STATS_INTERVAL_S
    if not (due_load or due_front):
        return
    snap: StatsSnapshot = engine.stats()
    snap.dp_rank = info.dp_rank
    snap.timestamp = time.time()
    pacer.latest = snap
    pacer.iteration_tokens.extend(snap.iteration_tokens)
    if due_load:
        pacer.last_load = now
        load.send(encode(snap))
    if due_front:
        key = (snap.num_running, snap.num_waiting, snap.kv_pages_used, snap.prefix_cache_queries,
               snap.num_preemptions, snap.gen_throughput, snap.eplb_rebalances)  # fmt: skip
        # While idle and unchanged there is nothing new to say but "alive" (the front end's heartbeat,
        # scheduler_liveness.py); a change (like KV freed) goes out at once.
        if key != pacer.last_key or pacer.iteration_tokens or now - pacer.last_frontend >= HEARTBEAT_S:
            pacer.last_frontend = now
            pacer.last_key = key
            snap.iteration_tokens = pacer.iteration_tokens
            pacer.iteration_tokens = []
            out.send(encode(snap))


def _log_progress(s: StatsSnapshot) -> None:
    # Stats are read only by the pacer: the engine resets per-step counters on every stats() call.
    logger.info(
        "running=%d waiting=%d kv=%.1f%% gen=%.1f tok/s preemptions=%d",
        s.num_running,
        s.num_waiting,
        100 * s.kv_usage,
        s.gen_throughput,
        s.num_preemptions,
    )
