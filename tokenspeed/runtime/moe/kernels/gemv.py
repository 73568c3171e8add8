"""MoE experts for a few decode tokens as two GEMVs on the CUDA cores: only the routed experts' rows are read.

At batch 1-16 a decode step routes T * k (token, expert) pairs, nearly all to different experts, and the
tensor-core path (`gemm.py`, one pair per BLOCK_M tile under `pairs_as_blocks`) wastes 15/16 of each tile
and needs a third launch to add each token's k rows. Here:

- `_gate_up_kernel`: program (pair, block of BLOCK_N intermediate columns) streams BLOCK_N gate rows and
  the matching BLOCK_N up rows of the pair's expert once, walking K in BLOCK_K chunks with PREFETCH chunks
  loaded ahead (a short K loop is latency-bound without it: see `kernels/bf16_gemv.py`), multiplying on
  the CUDA cores into float32 accumulators of the tile's shape (one reduction after the loop), and writes
  act[pair] = SiLU(gate) * up in x's dtype. Pairs of remote experts (id < 0) return at once. With `split`
  > 1 the K chunks of a tile are split over that many programs: each stores its float32 gate and up
  partials and counts its arrival, and the last to arrive adds them in split order, then applies SiLU * up.
  At one token a tile's 8 chunks (K = 2048) otherwise run one after another in one of 384 programs, the
  chain the down kernel's split shortened.
- `_down_kernel`: program (token, block of BLOCK_H outputs[, split]) walks the token's k pairs and each
  pair's K chunks as one flattened stream (the prefetch runs across pair boundaries), scaling each pair's
  activations by its routing weight, so the k-sum needs no `sum_pairs` launch and no per-pair buffer.

Filling the GPU in `down` (why atomics are optional): at one token the grid is H / BLOCK_H programs only
(2048 outputs: 256 programs at BLOCK_H = 8, two an SM on the H200's 132). Small BLOCK_H (1-4 rows, down
to one warp a program) fills it without atomics, deterministically, in two launches; `down_split` > 1
splits the k pairs over programs. Given `arrivals` (a buffer the caller keeps), each split stores its
float32 partial and counts its arrival, and the last of a (token, block) adds the partials in split order
and writes the output: still two launches, the same bits every run. Without it the splits add their
partials atomically (a zeroed buffer and a cast: two more graph nodes, and results then depend on
scheduling). Which wins is measured, not assumed: `benchmarks/moe_tune.py --gemv` times them, and the
tuned table (`gemv_table.py`) says which one a shape uses. The default, until a table measured on the
device says otherwise, stays the tensor-core path.

Routing in the first launch (`Routing`, TOKENSPEED_MOE_FUSED_ROUTE=1 in `moe/backend.py`, off until
timed): each gate/up program computes its pair's expert and weight from the token's router logits with
the routing kernel's own `routing.top_k_choices`, and the first program of a pair writes them for
`_down_kernel` and counts them for the expert recorder. With the split merged by arrivals, a layer at one
token is then two launches against the tensor-core path's four (routing, gate/up, down, pair sum).

Timed on the H200 before the gate/up split (`moe_tune.py --gemv`, results/gpu_moe_gemv.json, docs/GPU.md):
its best took 27.0 us a layer at one token against the tensor-core path's 26.3 us, so no tuned table ships.

FP8 experts (W8A16, `ExpertScales`: per channel [E, N, 1] or per block [E, N / bn, K / bk]) are read as
e4m3 and dequantized per K chunk with their rows' scales (BLOCK_K shrinks to the scale block), the same
arithmetic as `gemm.py`. Every shape depends only on the token count, so the layer captures in a graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tokenspeed.runtime.moe.kernels.gemm import WeightScale, scale_args
from tokenspeed.runtime.moe.kernels.routing import top_k_choices


@dataclass(frozen=True)
class MoeGemvConfig:
    """Launch configuration of both GEMVs (what `gemv_table.py` reads per shape and token count)."""

    block_n: int = 16  # gate rows (and as many up rows) per gate/up program
    block_k: int = 256
    num_warps: int = 4
    prefetch: int = 1  # K chunks loaded ahead of the one being multiplied (0, 1 or 2)
    down_block_h: int = 4  # outputs per down program
    down_block_k: int = 256
    down_num_warps: int = 4
    down_prefetch: int = 1
    down_split: int = 1  # programs the k pairs of one token are split over (the module docstring)
    split: int = 1  # programs each gate/up tile's K is split over, merged by the last to arrive

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "down_block_h", "down_block_k", "num_warps", "down_num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"MoeGemvConfig.{name} must be a power of two, got {v}")
        if not (0 <= self.prefetch <= 2 and 0 <= self.down_prefetch <= 2):
            raise ValueError("MoeGemvConfig.prefetch and down_prefetch must be 0, 1 or 2")
        if self.down_split < 1 or self.split < 1:
            raise ValueError(
                f"MoeGemvConfig.split and down_split must be >= 1, got {self.split}, {self.down_split}"
            )


@triton.jit
def _load_tile(rows, k, K, rmask, EVEN_K: tl.constexpr):
    # a weight tile read once this step (evict first); rmask is constant along K, so loads stay vectors
    if EVEN_K:
        w = tl.load(rows + k[None, :], mask=rmask[:, None], other=0.0, eviction_policy="evict_first")
    else:
        w = tl.load(rows + k[None, :], mask=rmask[:, None] & (k < K)[None, :], other=0.0,
                    eviction_policy="evict_first")  # fmt: skip
    return w


@triton.jit
def _load_vec(ptr, kk, K, EVEN_K: tl.constexpr):
    # activations as a tile of the weight tile's shape: the same layout, repeats are L1 hits
    if EVEN_K:
        return tl.load(ptr + kk).to(tl.float32)
    return tl.load(ptr + kk, mask=kk < K, other=0.0).to(tl.float32)


@triton.jit
def _gate_up_kernel(
    X, W, Act, Ids, S, INTER, K, stride_xm, stride_we, stride_wn, stride_am, stride_se, stride_sn, stride_sk,
    Logits, stride_l, Weights, Counts, Mask, E, Part, Arrivals,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_SCALE: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr,
    ROUTE: tl.constexpr = False, BLOCK_E: tl.constexpr = 1, BLOCK_TOP: tl.constexpr = 1,
    RENORM: tl.constexpr = False, RECORD: tl.constexpr = False, MASKED: tl.constexpr = False,
    SPLIT: tl.constexpr = 1,
):  # fmt: skip
    p = tl.program_id(0)
    if ROUTE:
        # the layer's routing in this launch: every program of pair p picks its expert from the token's
        # logits; the first writes it and its weight for `_down_kernel` and counts it for the recorder
        tok_r = p // TOP_K
        top_w, top_i = top_k_choices(
            Logits, stride_l, tok_r.to(tl.int64), E, TOP_K, BLOCK_E, BLOCK_TOP, RENORM
        )
        choice = tl.arange(0, BLOCK_TOP) == p % TOP_K
        e = tl.sum(tl.where(choice, top_i, 0), 0)
        w = tl.sum(tl.where(choice, top_w, 0.0), 0)
        if (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
            tl.store(Ids + p, e)
            tl.store(Weights + p, w)
            if RECORD:
                live = e >= 0
                if MASKED:
                    live = live & (tl.load(Mask + tok_r) != 0)
                tl.atomic_add(Counts + e, 1, mask=live)
    else:
        e = tl.load(Ids + p)
    if e >= 0:
        tok = (p // TOP_K).to(tl.int64)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < INTER
        offs_k = tl.arange(0, BLOCK_K)
        g_rows = W + e.to(tl.int64) * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
        u_rows = g_rows + INTER * stride_wn
        x_row = X + tok * stride_xm
        chunks = tl.cdiv(K, BLOCK_K)
        # this split's K chunks [lo, hi); prefetched chunk indices are clamped to [first, last] (a repeat
        # comes from cache), and a split past the last chunk runs no loop and adds zeros
        per_split = tl.cdiv(chunks, SPLIT)
        lo = tl.program_id(2) * per_split
        hi = tl.minimum(lo + per_split, chunks)
        first = tl.minimum(lo, hi - 1)
        last = tl.maximum(hi - 1, first)
        acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        if PREFETCH >= 1:
            k1 = first * BLOCK_K + offs_k
            g1 = _load_tile(g_rows, k1, K, nmask, EVEN_K)
            u1 = _load_tile(u_rows, k1, K, nmask, EVEN_K)
        if PREFETCH >= 2:
            k2 = tl.minimum(first + 1, last) * BLOCK_K + offs_k
            g2 = _load_tile(g_rows, k2, K, nmask, EVEN_K)
            u2 = _load_tile(u_rows, k2, K, nmask, EVEN_K)
        for i in range(lo, hi):
            k = i * BLOCK_K + offs_k
            if PREFETCH == 0:
                g = _load_tile(g_rows, k, K, nmask, EVEN_K)
                u = _load_tile(u_rows, k, K, nmask, EVEN_K)
            elif PREFETCH == 1:
                g = g1
                u = u1
                kn = tl.minimum(i + 1, last) * BLOCK_K + offs_k
                g1 = _load_tile(g_rows, kn, K, nmask, EVEN_K)
                u1 = _load_tile(u_rows, kn, K, nmask, EVEN_K)
            else:
                g = g1
                u = u1
                g1 = g2
                u1 = u2
                kn = tl.minimum(i + 2, last) * BLOCK_K + offs_k
                g2 = _load_tile(g_rows, kn, K, nmask, EVEN_K)
                u2 = _load_tile(u_rows, kn, K, nmask, EVEN_K)
            kk = tl.broadcast_to(k[None, :], [BLOCK_N, BLOCK_K])
            xv = _load_vec(x_row, kk, K, EVEN_K)
            gf = g.to(tl.float32)
            uf = u.to(tl.float32)
            if HAS_SCALE:
                # FP8 rows: the scale of each row's block this chunk lies in (BLOCK_K <= GK)
                s_row = S + e.to(tl.int64) * stride_se + ((i * BLOCK_K) // GK) * stride_sk
                sg = tl.load(s_row + (offs_n // GN) * stride_sn, mask=nmask, other=0.0)
                su = tl.load(s_row + ((INTER + offs_n) // GN) * stride_sn, mask=nmask, other=0.0)
                gf = gf * sg[:, None]
                uf = uf * su[:, None]
            acc_g += gf * xv
            acc_u += uf * xv
        gate = tl.sum(acc_g, axis=1)
        up = tl.sum(acc_u, axis=1)
        act = Act + p.to(tl.int64) * stride_am + offs_n
        if SPLIT == 1:
            tl.store(act, _silu_mul(gate, up).to(Act.dtype.element_ty), mask=nmask)
        else:
            # partials [SPLIT, pairs, gate | up] float32; the last split of this (pair, block) to arrive
            # adds them in split order, then SiLU(gate) * up (as the down kernel merges its splits)
            rows = tl.num_programs(0).to(tl.int64) * 2 * INTER
            part = Part + p.to(tl.int64) * 2 * INTER + offs_n
            mine = part + tl.program_id(2).to(tl.int64) * rows
            tl.store(mine, gate, mask=nmask)
            tl.store(mine + INTER, up, mask=nmask)
            tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
            slot = Arrivals + p.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
            arrived = tl.atomic_add(slot, 1, sem="acq_rel")
            if arrived == SPLIT - 1:
                g = tl.load(part, mask=nmask, other=0.0, cache_modifier=".cg")
                u = tl.load(part + INTER, mask=nmask, other=0.0, cache_modifier=".cg")
                for s in tl.static_range(1, SPLIT):
                    g += tl.load(part + s * rows, mask=nmask, other=0.0, cache_modifier=".cg")
                    u += tl.load(part + s * rows + INTER, mask=nmask, other=0.0, cache_modifier=".cg")
                tl.store(act, _silu_mul(g, u).to(Act.dtype.element_ty), mask=nmask)
                tl.store(slot, 0)  # ready for the next launch


@triton.jit
def _silu_mul(gate, up):
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _down_step(acc, i, CPP, t, offs_h, hmask, offs_k, Act, W, Ids, Weights, S, N, K, stride_am, stride_we,
               stride_wn, stride_se, stride_sn, stride_sk, w_tile,
               TOP_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
               HAS_SCALE: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr):  # fmt: skip
    # multiply chunk i of the flattened (pair, K chunk) stream, whose weight tile is `w_tile`
    p = t * TOP_K + i // CPP
    k = (i % CPP) * BLOCK_K + offs_k
    e = tl.load(Ids + p)
    rw = tl.where(e >= 0, tl.load(Weights + p), 0.0)
    kk = tl.broadcast_to(k[None, :], [BLOCK_H, BLOCK_K])
    live = (kk * 0 + e) >= 0  # (a vector mask: the interpreter takes no scalar one)
    a = tl.load(Act + p * stride_am + kk, mask=(kk < K) & live, other=0.0).to(tl.float32)
    wf = w_tile.to(tl.float32)
    if HAS_SCALE:
        sb = tl.load(
            S + tl.maximum(e, 0).to(tl.int64) * stride_se + ((i % CPP) * BLOCK_K // GK) * stride_sk
            + (offs_h // GN) * stride_sn,
            mask=hmask & ((offs_h * 0 + e) >= 0), other=0.0,
        )  # fmt: skip
        wf = wf * sb[:, None]
    return acc + wf * (a * rw)


@triton.jit
def _down_load(i, CPP, t, offs_h, hmask, offs_k, W, Ids, K, stride_we, stride_wn,
               TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):  # fmt: skip
    # the weight tile of chunk i: BLOCK_H rows of the pair's expert (nothing read for a remote expert)
    p = t * TOP_K + i // CPP
    e = tl.load(Ids + p)
    rows = W + tl.maximum(e, 0).to(tl.int64) * stride_we + offs_h[:, None].to(tl.int64) * stride_wn
    return _load_tile(rows, (i % CPP) * BLOCK_K + offs_k, K, hmask & ((offs_h * 0 + e) >= 0), EVEN_K)


@triton.jit
def _down_kernel(
    Act, W, Out, Acc, Ids, Weights, S, N, K, stride_am, stride_we, stride_wn, stride_om,
    stride_se, stride_sn, stride_sk, Arrivals,
    TOP_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
    SPLIT: tl.constexpr, EVEN_K: tl.constexpr, HAS_SCALE: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr,
    ARRIVE: tl.constexpr = False,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = offs_h < N
    offs_k = tl.arange(0, BLOCK_K)
    CPP = tl.cdiv(K, BLOCK_K)  # K chunks per pair
    per_split = tl.cdiv(TOP_K, SPLIT)
    lo = tl.program_id(2) * per_split * CPP
    hi = tl.minimum(lo + per_split * CPP, TOP_K * CPP)
    # a split past the token's last pair (k not a multiple of SPLIT) runs no loop; its prefetch still
    # reads the token's last chunk, never past the token's ids
    first = tl.minimum(lo, hi - 1)
    last = tl.maximum(hi - 1, first)
    acc = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float32)
    if PREFETCH >= 1:
        w1 = _down_load(
            first, CPP, t, offs_h, hmask, offs_k, W, Ids, K, stride_we, stride_wn, TOP_K, BLOCK_K, EVEN_K
        )
    if PREFETCH >= 2:
        w2 = _down_load(tl.minimum(first + 1, last), CPP, t, offs_h, hmask, offs_k, W, Ids, K, stride_we,
                        stride_wn, TOP_K, BLOCK_K, EVEN_K)  # fmt: skip
    for i in range(lo, hi):
        if PREFETCH == 0:
            w = _down_load(i, CPP, t, offs_h, hmask, offs_k, W, Ids, K, stride_we, stride_wn, TOP_K, BLOCK_K,
                           EVEN_K)  # fmt: skip
        elif PREFETCH == 1:
            w = w1
            w1 = _down_load(tl.minimum(i + 1, last), CPP, t, offs_h, hmask, offs_k, W, Ids, K, stride_we,
                            stride_wn, TOP_K, BLOCK_K, EVEN_K)  # fmt: skip
        else:
            w = w1
            w1 = w2
            w2 = _down_load(tl.minimum(i + 2, last), CPP, t, offs_h, hmask, offs_k, W, Ids, K, stride_we,
                            stride_wn, TOP_K, BLOCK_K, EVEN_K)  # fmt: skip
        acc = _down_step(acc, i, CPP, t, offs_h, hmask, offs_k, Act, W, Ids, Weights, S, N, K, stride_am,
                         stride_we, stride_wn, stride_se, stride_sn, stride_sk, w, TOP_K, BLOCK_H, BLOCK_K,
                         EVEN_K, HAS_SCALE, GN, GK)  # fmt: skip
    y = tl.sum(acc, axis=1)
    off = t * stride_om + offs_h
    if SPLIT == 1:
        tl.store(Out + off, y.to(Out.dtype.element_ty), mask=hmask)
    elif ARRIVE:
        # partials [SPLIT, T, N] float32; the last split of this (token, block) to arrive adds them in
        # split order and writes the output (`kernels/skinny_gemm.py` does the same across K splits)
        rows = tl.num_programs(0) * N
        part = Acc + t * N + offs_h
        tl.store(part + tl.program_id(2).to(tl.int64) * rows, y, mask=hmask)
        tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
        slot = Arrivals + t * tl.num_programs(1) + tl.program_id(1)
        arrived = tl.atomic_add(slot, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            total = tl.load(part, mask=hmask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT):
                total += tl.load(part + s * rows, mask=hmask, other=0.0, cache_modifier=".cg")
            tl.store(Out + off, total.to(Out.dtype.element_ty), mask=hmask)
            tl.store(slot, 0)  # ready for the next launch
    else:
        tl.atomic_add(Acc + off, y, mask=hmask, sem="relaxed")


def gate_up_tiles(tokens: int, top_k: int, inter: int, config: MoeGemvConfig) -> int:
    """Arrival counts a split gate/up launch takes: one per (pair, block of block_n columns)."""
    return tokens * top_k * -(-inter // config.block_n) if config.split > 1 else 0


def arrival_tiles(tokens: int, top_k: int, inter: int, hidden: int, config: MoeGemvConfig) -> int:
    """The int32 counts `moe_gemv` needs for `config` at `tokens` tokens: the split gate/up launch's, then
    the split down launch's (one per token and block of down_block_h outputs); 0 when neither splits."""
    down = tokens * -(-hidden // config.down_block_h) if config.down_split > 1 else 0
    return gate_up_tiles(tokens, top_k, inter, config) + down


def supported(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether `moe_gemv` takes these experts: weights contiguous in their last dimension."""
    return w13.stride(-1) == 1 and w2.stride(-1) == 1 and x.dim() == 2


@dataclass(frozen=True)
class Routing:
    """A layer's routing for `moe_gemv` to compute in its first launch, in place of `routing.fused_route`:
    float32 softmax over `logits` [T, E], the `top_k` largest (ties to the lower expert id), renormalised
    or not; `counts` (int32 per expert) gains one per choice of a token whose `token_mask` entry is not 0
    (every token without a mask). No expert parallelism: ids are the logical experts."""

    logits: torch.Tensor
    top_k: int
    renormalize: bool
    counts: torch.Tensor | None = None
    token_mask: torch.Tensor | None = None

    def kernel_args(self, ids: torch.Tensor, weights: torch.Tensor) -> dict:
        logits = self.logits if self.logits.stride(-1) == 1 else self.logits.contiguous()
        if self.counts is not None and self.counts.dtype != torch.int32:
            raise TypeError("Routing.counts must be int32")
        e = logits.shape[1]
        return dict(
            Logits=logits, stride_l=logits.stride(0), Weights=weights,
            Counts=ids if self.counts is None else self.counts,
            Mask=ids if self.token_mask is None else self.token_mask, E=e,
            ROUTE=True, BLOCK_E=triton.next_power_of_2(e), BLOCK_TOP=triton.next_power_of_2(self.top_k),
            RENORM=self.renormalize, RECORD=self.counts is not None,
            MASKED=self.counts is not None and self.token_mask is not None,
        )  # fmt: skip


def moe_gemv(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoeGemvConfig,
    scales=None,
    arrivals: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_* [T, k] -> [T, H] in x's
    dtype: sum over k of weight * expert(x). `scales`: the `ExpertScales` of FP8 experts. `arrivals` (int32
    zeros, at least `arrival_tiles(...)`, left zero by every launch): the last split of a split gate/up tile
    adds the partials in split order (without it such a launch zeroes counts of its own), and so does a
    split down kernel's, in place of float32 atomics into a zeroed buffer and a copy (two launches fewer,
    and the same bits every run)."""
    ids = topk_ids.to(torch.int32).contiguous()
    weights = topk_weights.to(torch.float32).contiguous()
    return _run(x, w13, w2, weights, ids, config, scales, None, arrivals)


def moe_gemv_routed(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    routing: Routing,
    config: MoeGemvConfig,
    scales=None,
    arrivals: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`moe_gemv` with the routing computed in its first launch (one launch fewer a layer): the output, and
    the float32 weights and int32 expert ids [T, k] it chose."""
    t = x.shape[0]
    ids = torch.empty((t, routing.top_k), dtype=torch.int32, device=x.device)
    weights = torch.empty((t, routing.top_k), dtype=torch.float32, device=x.device)
    return _run(x, w13, w2, weights, ids, config, scales, routing, arrivals), weights, ids


def _run(x, w13, w2, weights, ids, config, scales, routing: Routing | None, arrivals) -> torch.Tensor:
    """Both launches over `ids`/`weights`, which the first writes when it routes."""
    t, hidden = x.shape
    if not supported(x, w13, w2):
        raise ValueError("moe_gemv needs expert weights contiguous in their last dimension")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if t == 0:
        return torch.empty_like(x)
    top_k = ids.shape[1]
    inter = w13.shape[1] // 2
    s13: WeightScale | None = (scales.w13_scale, scales.block) if scales is not None else None
    s2: WeightScale | None = (scales.w2_scale, scales.block) if scales is not None else None

    act = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
    sa, sc, bk = scale_args(w13, s13, config.block_k)
    route = {} if routing is None else routing.kernel_args(ids, weights)
    dummy = ids  # a valid pointer for the arguments a launch never reads (routing, split partials)
    gu_grid = (t * top_k, triton.cdiv(inter, config.block_n), min(config.split, triton.cdiv(hidden, bk)))
    gu_tiles = gate_up_tiles(t, top_k, inter, config)
    need = arrival_tiles(t, top_k, inter, hidden, config)
    if arrivals is not None and (arrivals.dtype != torch.int32 or arrivals.numel() < need):
        raise ValueError(f"moe_gemv: arrivals must be int32 with >= {need} entries")
    if gu_grid[2] > 1:
        if arrivals is None:  # a caller without counts of its own (one zeroing launch more)
            arrivals = torch.zeros(gu_tiles, dtype=torch.int32, device=x.device)
        part = torch.empty((gu_grid[2], t * top_k, 2 * inter), dtype=torch.float32, device=x.device)
    _gate_up_kernel[gu_grid](
        x, w13, act, ids, sa[0], inter, hidden, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        *sa[1:], route.pop("Logits", dummy), route.pop("stride_l", 0), route.pop("Weights", dummy),
        route.pop("Counts", dummy), route.pop("Mask", dummy), route.pop("E", 1),
        part if gu_grid[2] > 1 else dummy, arrivals if gu_grid[2] > 1 else dummy,
        TOP_K=top_k, BLOCK_N=config.block_n, BLOCK_K=bk, PREFETCH=config.prefetch,
        EVEN_K=hidden % bk == 0, HAS_SCALE=sc.get("HAS_SCALE", False), GN=sc.get("GN", 1), GK=sc.get("GK", 1),
        SPLIT=gu_grid[2], num_warps=config.num_warps, num_stages=1, **route,
    )  # fmt: skip

    out = torch.empty((t, hidden), dtype=x.dtype, device=x.device)
    split = min(config.down_split, top_k)
    grid = (t, triton.cdiv(hidden, config.down_block_h), split)
    arrive = split > 1 and arrivals is not None and arrivals.numel() >= gu_tiles + grid[0] * grid[1]
    if arrive:
        arrivals = arrivals[gu_tiles:]  # the down kernel's counts follow the gate/up kernel's
        acc = torch.empty((split, t, hidden), dtype=torch.float32, device=x.device)
    else:
        acc = torch.zeros((t, hidden), dtype=torch.float32, device=x.device) if split > 1 else out
    sa, sc, bk = scale_args(w2, s2, config.down_block_k)
    _down_kernel[grid](
        act, w2, out, acc, ids, weights, sa[0], hidden, inter, act.stride(0), w2.stride(0), w2.stride(1),
        out.stride(0), *sa[1:], arrivals if arrive else ids, TOP_K=top_k, BLOCK_H=config.down_block_h,
        BLOCK_K=bk, PREFETCH=config.down_prefetch, SPLIT=split, EVEN_K=inter % bk == 0,
        HAS_SCALE=sc.get("HAS_SCALE", False), GN=sc.get("GN", 1), GK=sc.get("GK", 1), ARRIVE=arrive,
        num_warps=config.down_num_warps, num_stages=1,
    )  # fmt: skip
    if split > 1 and not arrive:
        out.copy_(acc)
    return out
