"""The GEMV kernels' autotuned entry points checked on the CPU (`bf16_gemv_checks.py`, `fp8_gemv_checks.py`):
the real autotuner (pruning, the config cache) with its timing function replaced by one that prefers a
given SPLIT_K, since the CPU cannot time GPU kernels."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import triton


def prefer_split(kernels: ModuleType, configs: list, key: list[str], want: int) -> list[int]:
    """Replace `kernels._tuned` (the module's autotuned `_launch`, pruned by its `_prune`) by one that
    times `configs` as the autotuner does and ranks those of SPLIT_K `want` fastest. Returns the list the
    SPLIT_K of every launch is appended to."""
    ran: list[int] = []

    def post(nargs: dict, exception: BaseException | None = None) -> None:
        ran.append(nargs["SPLIT_K"])

    def timing(kernel_call, quantiles=None) -> list[float]:
        kernel_call()
        return [0.5 if ran[-1] == want else 1.0] * 3

    kernels._tuned = triton.autotune(
        configs=[c.triton_config() for c in configs],
        key=key,
        prune_configs_by={"early_config_prune": kernels._prune},
        post_hook=post,
        do_bench=timing,
    )(kernels._launch)
    return ran


def tuned_then_cached(
    kernels: ModuleType, want: int, ran: list[int], fn: Callable[..., torch.Tensor], *args
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fn(*args)` twice after `prefer_split`: the first tunes (timing at least 10 configs and picking
    SPLIT_K `want`), the second comes from the config cache (nothing timed). Returns both outputs."""
    first = fn(*args)  # tunes
    chosen = kernels._tuned.best_config.kwargs["SPLIT_K"]
    timed = len(ran)
    again = fn(*args)  # from the cache: nothing timed
    assert chosen == want and len(ran) == timed and timed >= 10, (want, chosen, timed, ran)
    return first, again
