"""Where a scheduler-side process sits in the server, and how it logs. No torch here: the HTTP process
(which lays the ranks out) and the DP controller import it."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from tokenspeed.config.server_args import ServerArgs


@dataclass
class RankInfo:
    """Where this process sits in the server (from `Mapping.placement`). Every field is given: a default
    would quietly put a process on rank 0 or GPU 0."""

    rank: int
    dp_rank: int
    tp_rank: int
    gpu_id: int
    num_local_ranks: int


def configure_child_logging(server_args: ServerArgs, prefix: str) -> None:
    level = logging.getLevelName(server_args.log_level.upper())
    level = level if isinstance(level, int) else logging.INFO
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s [{prefix}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
