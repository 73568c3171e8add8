"""The Triton attention kernels compile to Hopper (sm_90) machine code on the CPU, with Triton's own ptxas:
a kernel that only Triton's interpreter has run (tests/engine/*_checks.py check what it computes) can still
fail to compile for a GPU, and this finds that before a device is asked for. It checks code generation
only; tests/gpu/ runs the kernels. The compiler and the occupancy reader are `tools/sm90_kernels.py`'s."""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")

from tools.sm90_kernels import INDEX, compile_sm90, resources  # noqa: E402 - needs Triton

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="compiles, does not interpret"
)


@pytest.mark.parametrize("fresh", [False, True], ids=["cache", "fresh"])
@pytest.mark.parametrize("cache", ["*bf16", "*fp8e4nv"], ids=["bf16", "fp8"])
def test_extend_attention_compiles(cache, fresh):
    from tokenspeed.runtime.kernels.extend_attention import _extend_kernel

    types = {"Q": "*bf16", "O": "*bf16", "K_buf": cache, "V_buf": cache, "K_new": "*bf16", "V_new": "*bf16",
             "sm_scale": "fp32", "k_scale": "fp32", "v_scale": "fp32", **INDEX}  # fmt: skip
    constants = dict(KV_GROUP=4, HEAD_DIM=128, BLOCK_M=128, BLOCK_N=64, BLOCK_D=128, IEEE=False, FP32_PV=False,
                     FRESH=fresh)  # fmt: skip
    assert compile_sm90(_extend_kernel, types, constants, num_warps=8, num_stages=3)


@pytest.mark.parametrize(("block_n", "num_stages"), [(64, 3), (128, 3)])
def test_decode_attention_compiles(block_n, num_stages):
    from tokenspeed.runtime.kernels.decode_attention import _decode_stage1_kernel, _decode_stage2_kernel

    types = {"Q": "*bf16", "K_buf": "*bf16", "V_buf": "*bf16", "Mid_O": "*fp32", "Mid_lse": "*fp32",
             "Out": "*bf16", "Arrivals": "*i32", "sm_scale": "fp32", **INDEX}  # fmt: skip
    for pdl in (False, True):
        for one_launch, splits in ((False, 2), (True, 2), (True, 1)):
            constants = dict(KV_GROUP=8, HEAD_DIM=128, NUM_SPLITS=splits, BLOCK_H=16, BLOCK_N=block_n,
                             BLOCK_D=128, BLOCK_S=2, IEEE=False, FP32_PV=False, ONE_LAUNCH=one_launch,
                             PDL=pdl)  # fmt: skip
            kernel = compile_sm90(_decode_stage1_kernel, types, constants, 4, num_stages, launch_pdl=pdl)
            _check_pdl(kernel, pdl)
            # one launch over several splits: the arrival count is a GPU-scope acquire-release atomic
            ptx = kernel.asm["ptx"]
            assert ("atom.global.gpu.acq_rel.add" in ptx) == (one_launch and splits > 1)
    types = {"Mid_O": "*fp32", "Mid_lse": "*fp32", "O": "*bf16"}
    for pdl in (False, True):
        constants = dict(HEAD_DIM=128, NUM_SPLITS=2, BLOCK_S=2, BLOCK_D=128, PDL=pdl)
        _check_pdl(compile_sm90(_decode_stage2_kernel, types, constants, 4, 2, launch_pdl=pdl), pdl)


def _check_pdl(kernel, pdl: bool) -> None:
    """A kernel compiled for programmatic dependent launch waits on its predecessor (kernels/pdl.py), and
    one compiled without it does not."""
    ptx = kernel.asm["ptx"]
    assert ("griddepcontrol.wait" in ptx) == pdl
    assert ("griddepcontrol.launch_dependents" in ptx) == pdl


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_the_pdl_probe_gemv_compiles_with_dependent_launch(pdl):
    """benchmarks/pdl_probe.py's GEMV: with PDL its PTX waits on the predecessor (griddepcontrol)."""
    from benchmarks.pdl_probe import _gemv_kernel

    types = {"X": "*bf16", "W": "*bf16", "Y": "*bf16"}
    kernel = compile_sm90(_gemv_kernel, types, dict(BLOCK_N=4, BLOCK_K=1024, PDL=pdl), 4, 1, launch_pdl=pdl)
    assert ("griddepcontrol.wait" in kernel.asm["ptx"]) == pdl


def _fp8_default_cases() -> list[tuple[int, int, int, int | None]]:
    """(bucket, N, K, block K) for each distinct configuration `default_config` gives on the 8B shapes."""
    from tokenspeed.runtime.kernels import fp8_gemv

    seen, cases = set(), []
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]:
        for bucket in (1, 4, 16):
            for block_k in (None, 128):
                cfg = fp8_gemv.default_config(bucket, n, k, block_k)
                if (cfg, bucket, block_k) not in seen:
                    seen.add((cfg, bucket, block_k))
                    cases.append((bucket, n, k, block_k))
    return cases


@pytest.mark.parametrize(("bucket", "n", "k", "block_k"), _fp8_default_cases())
def test_the_fp8_gemv_default_configscompile_sm90(bucket, n, k, block_k):
    from tokenspeed.runtime.kernels import fp8_gemv

    c = fp8_gemv.default_config(bucket, n, k, block_k)
    constants = dict(GN=128 if block_k else 1, GK=block_k or 0, HAS_BIAS=False, M_BUCKET=bucket, BLOCK_N=c.block_n,
                     BLOCK_K=c.block_k, SPLIT_K=c.split_k, USE_DOT=c.use_dot, PREFETCH=c.prefetch, SWAP_AB=c.swap_ab,
                     BLOCK_M=16 if c.use_dot else bucket, EVEN_K=k % c.block_k == 0, PDL=True)  # fmt: skip
    types = {"X": "*bf16", "W": "*fp8e4nv", "S": "*fp32", "Bias": "*fp32", "Out": "*bf16", "Part": "*fp32",
             "Arrivals": "*i32"}  # fmt: skip
    _check_pdl(
        compile_sm90(fp8_gemv._fp8_gemv_kernel, types, constants, c.num_warps, c.num_stages, launch_pdl=True),
        True,
    )


def _fp8_split_configs() -> list:
    from tokenspeed.runtime.kernels import fp8_gemv

    return fp8_gemv.SPLIT_CONFIGS


@pytest.mark.parametrize("cfg", _fp8_split_configs(), ids=str)
def test_the_fp8_gemv_split_k_candidates_merge_by_arrival(cfg):
    """The FP8 GEMV's split-K configurations compile for sm_90 with the splits merged in the launch: a
    GPU-scope acquire-release arrival and no float32 atomics."""
    from tokenspeed.runtime.kernels import fp8_gemv

    bucket = 1 if not cfg.use_dot else 16
    constants = dict(GN=1, GK=0, HAS_BIAS=True, M_BUCKET=bucket, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                     SPLIT_K=cfg.split_k, USE_DOT=cfg.use_dot, PREFETCH=cfg.prefetch, SWAP_AB=cfg.swap_ab,
                     BLOCK_M=16 if cfg.use_dot else bucket, EVEN_K=True, PDL=True)  # fmt: skip
    types = {"X": "*bf16", "W": "*fp8e4nv", "S": "*fp32", "Bias": "*fp32", "Out": "*bf16", "Part": "*fp32",
             "Arrivals": "*i32"}  # fmt: skip
    kernel = compile_sm90(
        fp8_gemv._fp8_gemv_kernel, types, constants, cfg.num_warps, cfg.num_stages, launch_pdl=True
    )
    ptx = kernel.asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx and "red.global.add.f32" not in ptx


def _dense_table_cases() -> list[tuple[str, dict[str, int]]]:
    """(shape key, configuration) for each distinct configuration the shipped H200 table gives."""
    from tokenspeed.runtime.kernels import gemv_table

    table = gemv_table.table_for_device("NVIDIA H200")
    seen, cases = set(), []
    for key, buckets in sorted(table.configs.items()):
        for bucket, cfg in sorted(buckets.items()):
            ident = (bucket, tuple(sorted(cfg.items())))
            if ident not in seen:
                seen.add(ident)
                cases.append((f"{key} m={bucket}", dict(cfg, BLOCK_M=int(bucket))))
    return cases


@pytest.mark.parametrize(("case", "cfg"), [pytest.param(c, cfg, id=c) for c, cfg in _dense_table_cases()])
def test_the_dense_gemv_table_configs_compile_with_dependent_launch(case, cfg):
    from tokenspeed.runtime.kernels.bf16_gemv import _dense_gemv_kernel

    constants = dict(HAS_BIAS=False, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                     SPLIT_K=cfg["SPLIT_K"], PREFETCH=cfg["PREFETCH"], EVEN_K=True, EVEN_N=True, PDL=True)  # fmt: skip
    types = {"X": "*bf16", "W": "*bf16", "Bias": "*bf16", "Out": "*bf16", "Part": "*fp32", "Arrivals": "*i32"}
    kernel = compile_sm90(
        _dense_gemv_kernel, types, constants, cfg["num_warps"], cfg["num_stages"], launch_pdl=True
    )
    _check_pdl(kernel, True)


def _split_candidates() -> list:
    from tokenspeed.runtime.kernels import bf16_gemv

    return [(c, m) for c in bf16_gemv.CONFIGS if c.split_k > 1 for m in (1, 2, 4) if bf16_gemv.fits(c, m)]


@pytest.mark.parametrize(("cfg", "m"), _split_candidates(), ids=str)
def test_the_dense_gemv_split_k_candidates_merge_by_arrival(cfg, m):
    """Every split-K configuration the GEMV's sweep times compiles for sm_90 with its splits merged in the
    launch: a GPU-scope acquire-release arrival, no float32 atomics, and nearly the programs an SM of the
    same tile unsplit (the merge's pointers stay live across the K loop: under Triton 3.6 the 8 x 256 tile
    at one row takes 56 registers against 40, 9 programs an SM against 12; every other tile is unchanged)."""
    from tokenspeed.runtime.kernels.bf16_gemv import _dense_gemv_kernel

    types = {"X": "*bf16", "W": "*bf16", "Bias": "*bf16", "Out": "*bf16", "Part": "*fp32", "Arrivals": "*i32"}
    constants = dict(HAS_BIAS=True, BLOCK_M=m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
                     PREFETCH=cfg.prefetch, EVEN_K=True, EVEN_N=True, PDL=True)  # fmt: skip
    split = compile_sm90(_dense_gemv_kernel, types, constants, cfg.num_warps, cfg.num_stages, launch_pdl=True)
    ptx = split.asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx and "red.global.add.f32" not in ptx
    whole = compile_sm90(
        _dense_gemv_kernel, types, dict(constants, SPLIT_K=1), cfg.num_warps, cfg.num_stages, launch_pdl=True
    )
    assert resources(split, cfg.num_warps).per_sm >= 0.75 * resources(whole, cfg.num_warps).per_sm
    _check_pdl(split, True)


def test_the_fused_ops_compile_with_dependent_launch():
    from tokenspeed.runtime.kernels.fused_ops import _rmsnorm_kernel, _silu_mul_kernel

    types = {"X": "*bf16", "R": "*bf16", "W": "*bf16", "Y": "*bf16", "RO": "*bf16", "eps": "fp32"}
    for has_res in (False, True):
        kernel = compile_sm90(
            _rmsnorm_kernel, types, dict(HAS_RES=has_res, BLOCK=4096, PDL=True), 16, 1, launch_pdl=True
        )
        _check_pdl(kernel, True)
    kernel = compile_sm90(
        _silu_mul_kernel, {"X": "*bf16", "Y": "*bf16"}, dict(BLOCK=2048, PDL=True), 4, 1, launch_pdl=True
    )
    _check_pdl(kernel, True)


@pytest.mark.parametrize("has_norm", [False, True], ids=["rope", "rope+qk-norm"])
def test_the_rope_kv_write_compiles_with_dependent_launch(has_norm):
    from tokenspeed.runtime.kernels.rope_store import _rope_store_kernel

    types = {n: "*bf16" for n in ("Q", "K", "V", "QO", "KO", "K_buf", "V_buf", "CS", "QW", "KW")}
    types.update(LOC="*i64", eps="fp32")
    constants = dict(NUM_Q_HEADS=32, HALF=64, BLOCK=64, HAS_NORM=has_norm, PDL=True)
    _check_pdl(compile_sm90(_rope_store_kernel, types, constants, 1, 1, launch_pdl=True), True)


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_the_moe_kernels_compile_with_dependent_launch(pdl):
    """Routing, the grouped gate|up and down GEMMs and the pair sum, at the H200 table's one-token config."""
    from tokenspeed.runtime.moe.kernels import gemm, routing

    route_types = {"Logits": "*bf16", "Weights": "*fp32", "Ids": "*i32", "Log2phy": "*i32", "Logcnt": "*i32",
                   "Counts": "*i32", "Mask": "*i32"}  # fmt: skip
    route = dict(TOP_K=8, BLOCK_E=128, BLOCK_K=8, RENORM=True, DISPATCH=0, LOCALIZE=False, RECORD=True,
                 MASKED=False, PDL=pdl)  # fmt: skip
    _check_pdl(compile_sm90(routing._route_kernel, route_types, route, 1, 1, launch_pdl=pdl), pdl)
    tile = dict(IEEE=False, EVEN_K=True, PAIRS=True, BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, HAS_SCALE=False, GN=1,
                GK=1, PDL=pdl)  # fmt: skip
    types = {
        "X": "*bf16",
        "W": "*bf16",
        "Act": "*bf16",
        "Sorted": "*i32",
        "BlockExpert": "*i32",
        "S": "*bf16",
    }
    _check_pdl(compile_sm90(gemm._gate_up_silu_kernel, types, dict(tile, TOP_K=8), 4, 3, launch_pdl=pdl), pdl)
    types = {"Act": "*bf16", "W": "*bf16", "Out": "*fp32", "Sorted": "*i32", "BlockExpert": "*i32",
             "Weights": "*fp32", "S": "*bf16"}  # fmt: skip
    _check_pdl(compile_sm90(gemm._down_kernel, types, dict(tile, BLOCK_N=64), 4, 3, launch_pdl=pdl), pdl)
    types = {"PerPair": "*fp32", "Ids": "*i32", "Out": "*bf16"}
    kernel = compile_sm90(
        gemm._sum_pairs_kernel, types, dict(TOP_K=8, BLOCK_N=1024, PDL=pdl), 4, 1, launch_pdl=pdl
    )
    _check_pdl(kernel, pdl)


@pytest.mark.parametrize("x", ["*bf16", "*fp16", "*fp32"])
def test_the_per_token_fp8_quantization_rounds_as_the_reference(x):
    """fp8_quant's kernel divides with IEEE rounding and casts to e4m3 rounding to nearest, as the PyTorch
    reference does (what makes its bytes the reference's; tests/gpu/test_fp8_gpu.py compares them)."""
    from tokenspeed.runtime.kernels.fp8_quant import _quantize_rows_kernel
    from tokenspeed.runtime.layers.quantization.fp8_math import FP8_MAX, MIN_SCALE

    types = {"X": x, "Q": "*fp8e4nv", "S": "*fp32"}
    kernel = compile_sm90(_quantize_rows_kernel, types, dict(FMAX=FP8_MAX, MIN_S=MIN_SCALE, BLOCK=2048), 4, 1)
    ptx = kernel.asm["ptx"]
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx and "div.approx" not in ptx
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx


def test_the_occupancy_report_reads_what_each_decode_kernel_takes_of_an_sm():
    """tools/sm90_kernels.py: every configuration the engine picks compiles, and its registers, shared memory
    and programs an SM come back from the cubin (the numbers are this Triton's; the report says which)."""
    from tools.sm90_kernels import decode_attention_rows, dense_gemv_rows, moe_rows

    rows = decode_attention_rows() + moe_rows() + dense_gemv_rows()
    assert len(rows) == 16 + 2 + len(dense_gemv_rows())
    for what, r, _ in rows:
        assert 16 <= r.registers <= 255 and r.shared > 0 and r.per_sm >= 1, (what, r)


@pytest.mark.parametrize(
    ("block_m", "block_n", "split_k", "swap_ab"),
    [(16, 64, 1, True), (64, 64, 4, False), (64, 128, 1, True), (128, 64, 1, False)],
    ids=["m16_swapped", "m64_split4", "m64_swapped", "m128"],
)
def test_skinny_gemm_compiles_to_wgmma(block_m, block_n, split_k, swap_ab):
    """The skinny GEMM (`kernels/skinny_gemm.py`) runs on Hopper's warpgroup MMA, swapped or not, and a split
    launch counts its arrivals with a GPU-scope acquire-release atomic."""
    from tokenspeed.runtime.kernels.skinny_gemm import _skinny_gemm_kernel

    types = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "Part": "*fp32", "Arrivals": "*i32"}
    constants = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128, SPLIT_K=split_k, EVEN_K=True,
                     SWAP_AB=swap_ab, IEEE=False, PDL=True)  # fmt: skip
    kernel = compile_sm90(_skinny_gemm_kernel, types, constants, 4, 4, aligned=True, launch_pdl=True)
    ptx = kernel.asm["ptx"]
    assert "wgmma" in ptx
    assert ("atom.global.gpu.acq_rel.add" in ptx) == (split_k > 1)
    _check_pdl(kernel, True)


@pytest.mark.parametrize(
    ("route", "arrive", "split"),
    [(False, False, 1), (True, True, 1), (False, True, 4), (True, True, 2)],
    ids=["plain", "routed_arrive", "gate_up_split", "routed_gate_up_split"],
)
def test_moe_gemv_compiles_with_routing_and_merged_split(route, arrive, split):
    """The few-token MoE GEMV (`moe/kernels/gemv.py`) with its routing in the first launch, its gate/up tiles
    split over K and its split down kernel merged by the last arrival: both compile for sm_90, each merge
    counts with a GPU-scope acquire-release atomic, and a split gate/up kernel fits as many programs an SM as
    the unsplit one."""
    from tokenspeed.runtime.moe.kernels import gemv

    types = {"X": "*bf16", "W": "*bf16", "Act": "*bf16", "Ids": "*i32", "S": "*bf16", "Logits": "*bf16",
             "Weights": "*fp32", "Counts": "*i32", "Mask": "*i32", "Part": "*fp32", "Arrivals": "*i32"}  # fmt: skip
    constants = dict(TOP_K=8, BLOCK_N=16, BLOCK_K=256, PREFETCH=1, EVEN_K=True, HAS_SCALE=False, GN=1, GK=1,
                     ROUTE=route, BLOCK_E=128, BLOCK_TOP=8, RENORM=True, RECORD=route, MASKED=route)  # fmt: skip
    gate_up = compile_sm90(gemv._gate_up_kernel, types, dict(constants, SPLIT=split), 4, 1, aligned=True)
    ptx = gate_up.asm["ptx"]
    assert ("atom.global" in ptx) == (route or split > 1)
    assert "atom.global.gpu.acq_rel.add" in ptx or split == 1
    if split > 1:
        unsplit = compile_sm90(gemv._gate_up_kernel, types, dict(constants, SPLIT=1), 4, 1, aligned=True)
        assert resources(gate_up, 4).per_sm >= resources(unsplit, 4).per_sm
    types = {"Act": "*bf16", "W": "*bf16", "Out": "*bf16", "Acc": "*fp32", "Ids": "*i32", "Weights": "*fp32",
             "S": "*bf16", "Arrivals": "*i32"}  # fmt: skip
    constants = dict(TOP_K=8, BLOCK_H=16, BLOCK_K=256, PREFETCH=2, SPLIT=4, EVEN_K=True, HAS_SCALE=False, GN=1,
                     GK=1, ARRIVE=arrive)  # fmt: skip
    down = compile_sm90(gemv._down_kernel, types, constants, 4, 1, aligned=True)
    assert ("atom.global.gpu.acq_rel.add" in down.asm["ptx"]) == arrive


@pytest.mark.parametrize("has_norm", [False, True], ids=["rope", "rope+qk-norm"])
def test_rope_rounds_each_product_as_pytorch_does(has_norm):
    """The RoPE kernels launch without floating-point contraction (`fused_ops.rope_launch`), so in bf16 each
    product and the sum round on their own (`mul.rn.bf16`, `add.rn.bf16`), as PyTorch's bf16 operations do;
    with contraction Triton 3.6 fused one product into the add (`fma.rn.bf16`) and the rotation came out a
    rounding away from PyTorch's."""
    import torch

    from tokenspeed.runtime.kernels.fused_ops import _rope_kernel, rope_launch
    from tokenspeed.runtime.kernels.rope_store import _rope_store_kernel

    q, k = torch.empty(1, 32, 128), torch.empty(1, 8, 128)
    _, consts = rope_launch(q, k)
    options = {n: consts.pop(n) for n in ("num_warps", "enable_fp_fusion")}
    assert options["enable_fp_fusion"] is False
    if has_norm:
        types = {n: "*bf16" for n in ("Q", "K", "V", "QO", "KO", "K_buf", "V_buf", "CS", "QW", "KW")}
        types.update(LOC="*i64", eps="fp32")
        kernel = compile_sm90(_rope_store_kernel, types, dict(consts, HAS_NORM=True), options["num_warps"], 1,
                              enable_fp_fusion=options["enable_fp_fusion"])  # fmt: skip
    else:
        types = {n: "*bf16" for n in ("Q", "K", "QO", "KO", "CS")}
        kernel = compile_sm90(_rope_kernel, types, consts, options["num_warps"], 1,
                              enable_fp_fusion=options["enable_fp_fusion"])  # fmt: skip
    ptx = kernel.asm["ptx"]
    assert "fma.rn" not in ptx
    assert "mul.rn.bf16" in ptx and "add.rn.bf16" in ptx
