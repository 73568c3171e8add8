"""`tokenspeed serve MODEL [flags]`: start the server's processes and the HTTP front end.

Life of a server (node 0):
  check every flag -> spawn schedulers (+ DP controller) -> tokenizer and front end set-up while they load
  -> wait for every rank's ReadyMessage -> HTTP up, status "starting"
  -> warm-up -> "ready" -> ... -> SIGTERM/SIGINT: "draining" (new requests get 503, in-flight ones finish
  within the grace period, then are aborted) -> children stopped -> exit 0.
A child that dies at any point ends the server with exit status 1 within seconds. Nodes > 0 run only
their scheduler processes (worker_node.py): they exit 0 when the head stops normally, 1 when they lose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from typing import Any, NoReturn

from tokenspeed.config import resolution_check
from tokenspeed.config.ports import bind_error
from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.support_check import SupportReport, assess, field_statuses, no_effect_warning
from tokenspeed.runtime.startup_phases import StartupPhases

logger = logging.getLogger("tokenspeed.serve")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser():
    from tokenspeed.config.cli import build_parser as server_parser

    parser = server_parser(prog="tokenspeed serve")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="Print the resolved server arguments and the rank mapping as JSON, then exit.",
    )
    return parser


def parse_args(argv: list[str]) -> tuple[Any, bool]:
    from tokenspeed.config.cli import from_namespace

    ns = build_parser().parse_args(argv)
    print_config = bool(ns.print_config)
    del ns.print_config
    return from_namespace(ns), print_config


def print_config(server_args: ServerArgs, report: SupportReport) -> None:
    from tokenspeed.runtime.distributed.mapping import Mapping

    mapping = Mapping.from_server_args(server_args)
    config = server_args.to_dict()
    config.pop("mapping", None)
    # Every value that differs from its default, with what this build does with it (config/support.py).
    support = field_statuses(server_args, report)
    print(
        json.dumps(
            {"server_args": config, "support": support, "mapping": mapping.to_dict()}, indent=2, default=str
        )
    )


def configure_logging(server_args: ServerArgs) -> None:
    level = logging.getLevelName(server_args.log_level.upper())
    level = level if isinstance(level, int) else logging.INFO
    logging.basicConfig(
        level=level,
        format="%(asctime)s [main] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def main(argv: list[str] | None = None) -> int:
    startup = StartupPhases()
    startup.since_start("process start and imports")
    checks_began = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        server_args, want_config = parse_args(argv)
    except ValueError as exc:
        print(f"tokenspeed serve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = assess(server_args)
    if want_config:
        print_config(server_args, report)
    if report.refused:
        print(f"tokenspeed serve: error: {report.error()}", file=sys.stderr)
        return EXIT_USAGE
    if want_config:
        return EXIT_OK
    configure_logging(server_args)
    if (warning := no_effect_warning(report)) is not None:
        logger.warning("%s", warning)
    for difference in resolution_check.differences(server_args, os.environ.get(resolution_check.EXPECTED_ENV)):
        logger.warning("resolved differently from the supervisor that started this server: %s", difference)
    try:
        check_model_source(server_args)
        check_device_present(server_args)
        if server_args.node_rank > 0:
            return _run_worker_node(server_args)
        startup.add("flags and checks", time.monotonic() - checks_began)
        code = asyncio.run(_run_head(server_args, startup))
    except ValueError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """End the served process once its children are stopped and its clients answered.

    Tearing the interpreter down (torch, tokenizers and a few hundred modules) takes one to two more
    seconds on a loaded machine, which a supervisor stopping or restarting the server would wait through
    for nothing; the logs are flushed first, nothing else is left to release.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check_model_source(server_args: ServerArgs) -> None:
    """A model that is not here fails now (under a second), not after the hub's retries or a rank start."""
    from tokenspeed.runtime.models.model_source import check_model_source as check
    from tokenspeed.runtime.models.model_source import check_weights_readable

    check(str(server_args.model), server_args.tokenizer, server_args.skip_tokenizer_init)
    check_weights_readable(str(server_args.model), server_args.load_format)
    check_quantization(server_args)


def check_quantization(server_args: ServerArgs) -> None:
    """A checkpoint quantized by a method this build cannot run (AWQ, GPTQ, MXFP4, ...), or one that
    contradicts --quantization, is refused now naming the method, not once a rank reads its weights."""
    from tokenspeed.config.quantization import weight_quant
    from tokenspeed.demo_models import resolve_model_path

    path = os.path.join(resolve_model_path(str(server_args.model)), "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return  # the ranks' model config reports an unreadable config.json with its own message
    weight_quant(config, server_args.quantization, str(server_args.model))


def check_device_present(server_args: ServerArgs) -> None:
    """Refuse to start on a device this machine lacks, before any rank process starts and fails on it.

    (`--print-config` skips this: checking a GPU configuration from a laptop is what it is for.)
    """
    if str(server_args.device) != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        build = (
            "built without CUDA"
            if torch.version.cuda is None
            else f"CUDA {torch.version.cuda}, no GPU visible"
        )
        raise ValueError(
            f"--device cuda (the default) needs an NVIDIA GPU, and torch {torch.__version__} ({build}) sees "
            "none here; pass --device cpu to serve on the CPU"
        )


def _check_port_free(host: str, port: int) -> None:
    exc = bind_error(port, host)
    if exc is not None:
        raise ValueError(f"--port {port} on {host} is not available ({exc}); choose another --port") from exc


def vocab_size_of(server_args: ServerArgs) -> int | None:
    """The model's vocabulary size from its config.json, None when it cannot be read."""
    from tokenspeed.demo_models import resolve_model_path

    # The model may be a name (`demo`) resolved to a folder, as the schedulers resolve it.
    path = os.path.join(resolve_model_path(str(server_args.model)), "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


def _run_worker_node(server_args: ServerArgs) -> int:
    from tokenspeed.runtime.entrypoints.worker_node import run_worker_node

    return run_worker_node(server_args)


def _check_metrics_flags(server_args: ServerArgs) -> None:
    reporters = server_args.metrics_reporters or ["prometheus"]
    if server_args.enable_metrics and "prometheus" not in reporters:
        raise ValueError(f"--metrics-reporters {reporters}: this build exports only 'prometheus'")


def _server_metrics(server_args: ServerArgs, model_name: str):
    if not server_args.enable_metrics:
        return None
    from prometheus_client import disable_created_metrics

    from tokenspeed.runtime.metrics.collector import ServerMetrics

    # `*_created` timestamps double the exposition size and no dashboard of ours reads them.
    disable_created_metrics()
    return ServerMetrics(model_name, server_args.app_key)


async def _run_head(server_args: ServerArgs, startup: StartupPhases) -> int:
    """Node 0: the schedulers are spawned as soon as every flag is checked, so that the front end's own
    start-up (torch and transformers imports, the tokenizer, the HTTP app) runs while they load."""
    with startup.phase("flags and checks"):
        from tokenspeed.runtime.engine.endpoints import ServerEndpoints
        from tokenspeed.runtime.engine.process_watchdog import RankFailed
        from tokenspeed.runtime.entrypoints.launch import ServerProcesses
        from tokenspeed.runtime.entrypoints.server_state import parse_preferred_sampling_params, served_names
        from tokenspeed.runtime.entrypoints.warmup import warmup_names

        # Everything a user can get wrong is checked before any process starts.
        _check_port_free(server_args.host, server_args.port)
        _check_metrics_flags(server_args)
        warmups = warmup_names(server_args)
        preferred = parse_preferred_sampling_params(server_args)
        names = served_names(server_args)
    endpoints = ServerEndpoints.from_server_args(server_args)
    procs = ServerProcesses(server_args, endpoints)
    llm = None
    try:
        with startup.phase("starting the schedulers"):
            procs.start()
        # From here on a failure must stop the children: the `finally` below does.
        with startup.phase("front end imports"):
            from tokenspeed.runtime.engine.async_llm import AsyncLLM
            from tokenspeed.runtime.engine.tokenizer import get_tokenizer
            from tokenspeed.runtime.entrypoints.http_runner import run_http
            from tokenspeed.runtime.entrypoints.server_state import ServerState
        with startup.phase("tokenizer"):
            tokenizer = get_tokenizer(server_args)
        with startup.phase("front end set-up"):
            metrics = _server_metrics(server_args, names[0])
            llm = AsyncLLM(
                server_args,
                tokenizer,
                metrics,
                endpoints=endpoints,
                check_alive=procs.check_alive,
                vocab_size=vocab_size_of(server_args),
            )
            state = ServerState(server_args, llm, tokenizer, metrics, names, preferred)
            state.child_pids = procs.pids()
            if metrics is not None:
                metrics.watch_process_tree(lambda: {pid: name for name, pid in state.child_pids.items()})
        try:
            with startup.phase("waiting for the schedulers"):
                await llm.wait_ready(server_args.mapping.world_size)
        except RankFailed as exc:  # a rank said why it could not start, or its process exited
            logger.error("start-up failed: %s", exc)
            return EXIT_FAILED
        llm.start()
        return await run_http(state, procs, warmups, startup)
    finally:
        with contextlib.suppress(Exception):
            procs.shutdown()
        if llm is not None:
            with contextlib.suppress(Exception):
                await llm.close()
        endpoints.cleanup()


if __name__ == "__main__":
    sys.exit(main())
