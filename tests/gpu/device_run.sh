#!/usr/bin/env bash
# GPU tests and benchmarks in stages that each fit one 10-minute device call; one log ($OUT/run.log), the
# results JSON and the FlashInfer JIT cache come back (the tool returns at most 8 files).
#   bash tests/gpu/wheels.sh      (once, on the CPU machine: .whl/ holds the wheels the image lacks + install.sh)
#   source .whl/install.sh && TOKENSPEED_COMMIT=<git rev-parse HEAD> bash tests/gpu/device_run.sh tests|bench|e2e ...
#   (carry .whl; the device copy has no .git, so the results' provenance takes the commit from TOKENSPEED_COMMIT)
# Stages (the groups run their parts in this order):
#   tests = kernels flashinfer engine   GPU tests: fused kernels, attention backends, samplers, engine
#   bench = decode prefill moe offline  benchmarks/*.py on Llama-3.1-8B / Qwen3-30B-A3B shapes
#   fp8   = fp8gemv fp8 fp8bench        FP8 GEMV tests and microbenchmark (benchmarks/fp8_gemv.py), FP8
#                                       GEMM/KV tests, decode with FP8 weights and FP8 KV cache
#   verify = structured spec fp8        grammar under CUDA graphs, speculative greedy == plain, FP8 tests
#   bf16gemv                            the dense bf16 GEMV's GPU tests, then benchmarks/bf16_gemv.py (GEMV vs
#                                       cuBLAS on the Llama-3.1-8B shapes, M = 1, 2, 4) -> $OUT/gpu_bf16_gemv.json
#                                       and its tuned table $OUT/dense_gemv_table.json, then 8B decode steps
#                                       with that table (auto) and with cuBLAS (torch) -> gpu_decode_dense_*.json
#   moe-all = moetests moetune moedecode moeoffline   fused MoE tests, block-size sweep, decode per config,
#                                       the offline Engine per config (default record eplb torch)
#   moegemv                             the few-token MoE GEMV: its GPU tests, then `moe_tune.py --gemv` (launch-config
#                                       sweep; tensor-core path vs GEMV per layer at 1-16 tokens with the bandwidth
#                                       share) -> $OUT/gpu_moe_gemv.json and the tuned table $OUT/moe_gemv_table.json
#                                       (copy it to tokenspeed/runtime/moe/kernels/tuned/NVIDIA_H200.json to ship it)
#   moegemvdecode                       Qwen3-30B-A3B decode steps (bs 1-16, 64), recording off and on, with the
#                                       GEMV table (MOE_GEMV_TABLE, default the shipped one) and with it off
#   moedense                            Qwen3-30B-A3B's dense linears: `bf16_gemv.py --model qwen3moe` -> gpu_bf16_gemv_qwen3moe.json
#                                       and the merged table dense_gemv_table.json, then MoE decode steps with the
#                                       table (auto; default and record) and with cuBLAS (torch) -> gpu_decode_qwen3moe*.json
#   decodeattn                          benchmarks/decode_attention.py: the Triton decode attention's launch
#                                       configurations on the 8B and MoE shapes -> $OUT/gpu_decode_attention.json
#   decodeattnfp8                       the same over an FP8 KV cache at context 4k -> $OUT/gpu_decode_attention_fp8kv.json
#   pdlab                               GPU kernel, engine and dense-GEMV tests with programmatic dependent launch
#                                       (on by default; TOKENSPEED_PDL=1 forces it)
#   decodeab                            benchmarks/decode_ab.py: whole decode steps plain and with each opt-in,
#                                       alternating in one process, per shape -> $OUT/gpu_decode_ab_<model>.json
#   onelaunch                           decode attention in one launch: its GPU tests, then decode_ab.py's whole 8B
#                                       steps PDL vs PDL + one launch -> $OUT/gpu_decode_ab_one_llama8b.json
#   moeroute                            the MoE GEMV's split merged by arrivals and routing in its first launch: GPU
#                                       tests, then decode_ab.py on Qwen3-30B-A3B (pdl, +one, +gemv, +route, all)
#                                       -> $OUT/gpu_decode_ab_route_qwen3moe.json
#   skinny                              benchmarks/skinny_gemm.py: the skinny tensor-core GEMM's configurations vs cuBLAS
#                                       on the 8B's GEMMs at 16 and 64 rows -> $OUT/gpu_skinny_gemm.json, and the
#                                       shipped table with its wins as 'skinny' entries -> $OUT/dense_gemv_table.json
#   pdl                                 benchmarks/pdl_probe.py: a chain of 8B-shaped GEMVs with and without
#                                       programmatic dependent launch -> $OUT/gpu_pdl_probe.json
#   specbench                           benchmarks/speculative_gpu.py: verify and draft steps vs plain decode
#   ngram                               benchmarks/ngram_speculative.py: the offline Engine plain vs NGRAM on repetitive
#                                       prompts (8B shape, batch 1 and 16) -> $OUT/gpu_ngram.json, then the
#                                       trained demo model -> $OUT/gpu_ngram_demo.json
#   imports                             where start-up's model-config and tokenizer seconds go (-X importtime)
#   e2e   = fleet serving               profile -> plan -> up -> openai client -> kill -9 -> down;
#                                       benchmarks/serving_gpu.py (HTTP vs offline engine, both backends)
# `tritoncache` packs ~/.triton/cache the same way (triton-cache.txz.partNN, for tests/gpu/cache/ while its kernels are current).
# `cache` packs ~/.cache/flashinfer into $OUT/flashinfer-cache.txz.partNN (xz, 15 MB each): copy them into tests/gpu/cache/
# and every later call skips FlashInfer's JIT (.whl/install.sh joins and unpacks them). Each part has its own time limit
# (T_<PART> seconds) so a stuck one cannot eat the call.
set -u
[ -n "${TOKENSPEED_COMMIT:-}" ] || echo "warning: TOKENSPEED_COMMIT is not set: results will record no commit" >&2
export TOKENSPEED_COMMIT
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
LOG="$OUT/run.log"
PYT="python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts= --timeout 150"
stage() { echo "=== $1 $(date -u +%T)" | tee -a "$LOG"; }
run() {
  local t=$1; shift; timeout "$t" "$@" >> "$LOG" 2>&1; echo "--- exit $? ($*)" | tee -a "$LOG"
  reap_gpu
}
# A part cut off by its time limit can leave processes holding the GPU (a detached fleet that `tokenspeed down`
# in the test's teardown never stopped held 122 GB and every later part ran out of memory): this machine is
# ours alone, so whatever still holds GPU memory between parts is a leftover.
reap_gpu() {
  local pids="" p
  pkill -9 -f console.supervisor.daemon 2>/dev/null && echo "--- killed a leftover fleet supervisor" | tee -a "$LOG"
  for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' '); do
    ps -o args= -p "$p" 2>/dev/null | grep -q warm_flashinfer || pids="$pids $p"  # the warm-up runs on
  done
  [ -z "$pids" ] && return
  echo "--- killing leftover GPU processes: $pids" | tee -a "$LOG"
  kill -9 $pids 2>/dev/null; sleep 2
}
WARM_PIDS=()

warm() {  # compile FlashInfer's families in the background (no-op in effect when the cache was carried)
  stage warm-flashinfer
  for fam in prefill decode sampling; do
    (timeout 240 python3 tests/gpu/warm_flashinfer.py $fam > /tmp/warm_$fam.log 2>&1; tail -n 2 /tmp/warm_$fam.log >> "$LOG") &
    WARM_PIDS+=($!)
  done
}
wait_warm() { for p in "${WARM_PIDS[@]}"; do wait "$p"; done; WARM_PIDS=(); }

part_kernels() {
  stage tests-kernels
  run ${T_KERNELS:-150} $PYT tests/gpu/test_fused_ops.py tests/gpu/test_attention_backends.py \
    tests/gpu/test_gpu_samplers.py -k "${K_KERNELS:-not flashinfer}"
}
part_flashinfer() {
  wait_warm
  stage tests-flashinfer
  run ${T_FI:-90} $PYT tests/gpu/test_attention_backends.py tests/gpu/test_gpu_samplers.py -k "${K_FI:-flashinfer}"
}
part_engine() {
  stage tests-engine
  run ${T_ENGINE:-120} $PYT tests/gpu/test_engine_gpu.py tests/gpu/test_fused_moe.py
}
part_decode() {
  stage bench-decode
  run ${T_DECODE:-150} python3 benchmarks/decode.py --backends triton flashinfer ${DECODE_ARGS:-} --out "$OUT/gpu_decode.json"
  grep -E "bandwidth|ratio=|eager|kernels/step|faster" "$LOG" | tail -60
}
part_fp8() {
  stage tests-fp8
  # the GEMV's tests compile ~80 kernel variants (~60 s); the whole file took 215 s on 2026-12-05 and ran past
  # 240 s in the next call, cut before its pass line
  run ${T_FP8:-330} $PYT -s tests/gpu/test_fp8_gpu.py
  grep -E "^gemv m=.*rel err [0-9.e+-]*$|^autotuned gemv|^bs1 decode step" "$LOG" | tail -12
}
part_fp8gemv() {  # the FP8 GEMV of decode batches: GEMV vs _scaled_mm vs bf16 (8B shapes); its tests are in `fp8`
  stage bench-fp8-gemv
  run ${T_FP8GEMV:-150} python3 benchmarks/fp8_gemv.py --out "$OUT/gpu_fp8_gemv.json"
  grep -E "^(qkv|o|gate_up|down) +[0-9]|speedup|Error" "$LOG" | tail -50
}
part_bf16gemvtests() {  # the dense bf16 GEMV's GPU tests (compile ~40 variants)
  stage bf16-gemv-tests
  run ${T_BF16GEMV_TESTS:-240} $PYT --timeout 230 -s tests/gpu/test_bf16_gemv_gpu.py
  grep -E "^bf16 gemv .*rel err|^autotuned bf16 gemv|^graph replay|^bs1 decode step" "$LOG" | tail -20
}
part_bf16gemvbench() {  # GEMV vs cuBLAS on the 8B shapes
  stage bf16-gemv-bench
  run ${T_BF16GEMV:-150} python3 benchmarks/bf16_gemv.py --out "$OUT/gpu_bf16_gemv.json" \
    --table-out "$OUT/dense_gemv_table.json"
  grep -E "^(qkv|o|gate_up|down|lm_head) +[0-9]|^shape|decode-step|copy bandwidth|total|Error" "$LOG" | tail -60
}
part_bf16gemvdecode() {  # whole 8B decode steps: the tuned table of bf16gemvbench (auto) against cuBLAS (torch)
  stage bf16-gemv-decode
  local tuned=tokenspeed/runtime/kernels/tuned/NVIDIA_H200.json
  [ -f "$OUT/dense_gemv_table.json" ] && mkdir -p "$(dirname $tuned)" && cp "$OUT/dense_gemv_table.json" "$tuned"
  for b in auto torch; do
    run ${T_BF16GEMV_DECODE:-150} python3 benchmarks/decode.py --backends triton --contexts 1024 \
      --batch-sizes 1 2 4 64 --dense-gemv-backend $b --out "$OUT/gpu_decode_dense_$b.json"
  done
  grep -E "ratio=|Triton GEMV" "$LOG" | tail -20
}
part_moedense() {  # Qwen3-30B-A3B's dense linears (attention, router, LM head): GEMV vs cuBLAS and the tuned table
  # merged into the shipped one, then MoE decode steps with that table (auto) and with cuBLAS (torch)
  stage moe-dense-gemv
  local tuned=tokenspeed/runtime/kernels/tuned/NVIDIA_H200.json
  run ${T_MOEDENSE:-150} python3 benchmarks/bf16_gemv.py --model qwen3moe --out "$OUT/gpu_bf16_gemv_qwen3moe.json" \
    --table-out "$OUT/dense_gemv_table.json" --table-base "$tuned"
  grep -E "^(qkv|o|router|lm_head) +[0-9]|decode-step|wrote" "$LOG" | tail -16
  [ -f "$OUT/dense_gemv_table.json" ] && cp "$OUT/dense_gemv_table.json" "$tuned"
  run ${T_MOE_DECODE:-150} python3 benchmarks/decode.py --model qwen3moe --backends triton \
    --moe-configs default record --contexts 1024 --batch-sizes 1 16 64 256 --max-total-tokens 300000 \
    --dense-gemv-backend auto --out "$OUT/gpu_decode_qwen3moe.json"
  run ${T_MOE_DECODE:-150} python3 benchmarks/decode.py --model qwen3moe --backends triton \
    --moe-configs default --contexts 1024 --batch-sizes 1 16 --max-total-tokens 300000 \
    --dense-gemv-backend torch --out "$OUT/gpu_decode_qwen3moe_cublas.json"
  grep -E "ratio=|recording cost|Triton GEMV" "$LOG" | tail -20
}
part_structured() {
  stage tests-structured
  run ${T_STRUCTURED:-120} $PYT -s tests/gpu/test_gpu_structured_output.py
}
part_spec() {
  stage tests-speculative
  run ${T_SPEC:-120} $PYT -s tests/gpu/test_speculative_gpu.py
}
part_specbench() {  # speculative decoding, 8B shape: plain decode vs a 5-token verify (graphs) vs an EAGLE3 draft
  stage bench-speculative
  run ${T_SPECBENCH:-180} python3 benchmarks/speculative_gpu.py ${SPECBENCH_ARGS:-} --out "$OUT/gpu_speculative.json"
  grep -E "bs=|goal|graph use|graphs|Error|error" "$LOG" | tail -40
}
part_ngram() {  # NGRAM prompt lookup through the Engine on repetitive prompts, against plain decoding
  stage bench-ngram
  run ${T_NGRAM:-240} python3 benchmarks/ngram_speculative.py ${NGRAM_ARGS:-} --out "$OUT/gpu_ngram.json"
  # the trained demo model (bf16): what repetitive prompts reach with a model that copies, and greedy equality
  run ${T_NGRAM:-240} python3 benchmarks/ngram_speculative.py --model demo --prompt-len 256 --max-new-tokens 64 \
    --out "$OUT/gpu_ngram_demo.json"
  grep -E "^(plain|ngram)" "$LOG" | tail -12
}
part_fp8bench() {  # decode with FP8 weights (bs 1) and an FP8 KV cache (bs 64 @ 4k) vs bf16, same run
  stage bench-decode-fp8
  run ${T_FP8_BENCH:-200} python3 benchmarks/decode.py --backends triton flashinfer --batch-sizes 1 64 \
    --contexts 4096 --out "$OUT/gpu_decode_bf16_4k.json"
  run ${T_FP8_BENCH:-200} python3 benchmarks/decode.py --backends ${FP8W_BACKENDS:-triton flashinfer} \
    --batch-sizes 1 64 --contexts 4096 --quantization fp8 --out "$OUT/gpu_decode_fp8_weights.json"
  run ${T_FP8_BENCH:-200} python3 benchmarks/decode.py --backends triton flashinfer --batch-sizes 1 64 \
    --contexts 4096 --kv-cache-dtype fp8_e4m3 --out "$OUT/gpu_decode_fp8_kv.json"
  grep -E "ratio=" "$LOG" | tail -20
}
part_prefill() {
  stage bench-prefill
  run ${T_PREFILL:-60} python3 benchmarks/prefill.py --out "$OUT/gpu_prefill.json"
  grep -E "peak|share=" "$LOG" | tail -14
}
part_moe() {
  stage bench-decode-moe
  run ${T_MOE:-90} python3 benchmarks/decode.py --model qwen3moe --backends triton --contexts 1024 \
    --batch-sizes 1 4 16 64 256 --max-total-tokens 300000 --out "$OUT/gpu_decode_qwen3moe.json"
}
part_moetests() {
  stage tests-moe
  run ${T_MOE_TESTS:-90} $PYT tests/gpu/test_fused_moe.py
}
part_moetune() {  # the fused MoE kernel's block-size sweep
  stage tune-moe
  run ${T_MOE_TUNE:-60} python3 benchmarks/moe_tune.py --tokens ${TUNE_TOKENS:-1 4 16 64 256} --out "$OUT/gpu_moe_tune.json"
}
part_moedecode() {  # the roofline rows per MoE kernel configuration
  stage bench-decode-moe-configs
  run ${T_MOE_DECODE:-100} python3 benchmarks/decode.py --model qwen3moe --backends triton \
    --moe-configs ${MOE_CONFIGS:-default record} --contexts 1024 --batch-sizes 1 16 64 256 \
    --max-total-tokens 300000 --out "$OUT/gpu_decode_qwen3moe.json"
}
part_moegemvtests() {  # the few-token MoE GEMV's GPU tests (~70 kernel variants)
  stage moe-gemv-tests
  run ${T_MOEGEMV_TESTS:-300} $PYT --timeout 280 -s tests/gpu/test_moe_gemv_gpu.py
  grep -E "^moe gemv tokens=" "$LOG" | tail -8
}
part_moegemvtune() {  # the sweep that writes the GEMV's table and compares it with the tensor-core path
  stage moe-gemv-tune
  run ${T_MOEGEMV_TUNE:-240} python3 benchmarks/moe_tune.py --gemv --tokens ${GEMV_TOKENS:-1 2 4 8 16} \
    --out "$OUT/gpu_moe_gemv.json" --table-out "$OUT/moe_gemv_table.json"
  grep -E "copy bandwidth|tensor-core path|BEST GEMV|as tuned|WRONG|skipped" "$LOG" | tail -40
}
part_moegemvdecode() {  # whole decode steps: the GEMV table vs the tensor-core path; recording off and on
  stage bench-decode-moe-gemv
  run ${T_MOEGEMV_DECODE:-200} env TOKENSPEED_MOE_GEMV=${MOE_GEMV_TABLE:-} python3 benchmarks/decode.py --model qwen3moe \
    --backends triton --moe-configs default record --contexts 1024 --batch-sizes 1 2 4 8 16 64 \
    --max-total-tokens 300000 --out "$OUT/gpu_decode_qwen3moe_gemv.json"
  run ${T_MOEGEMV_DECODE:-200} env TOKENSPEED_MOE_GEMV=off python3 benchmarks/decode.py --model qwen3moe \
    --backends triton --moe-configs default --contexts 1024 --batch-sizes 1 2 4 8 16 64 \
    --max-total-tokens 300000 --out "$OUT/gpu_decode_qwen3moe_tc.json"
  grep -E "ratio=|recording cost|moe gemv table" "$LOG" | tail -40
}
part_decodeattn() {  # the Triton decode attention alone: each launch configuration on the 8B and MoE shapes
  stage bench-decode-attention
  run ${T_DECODE_ATTN:-240} python3 benchmarks/decode_attention.py --out "$OUT/gpu_decode_attention.json"
  grep -E "^(qwen3moe|llama8b) bs" "$LOG" | tail -10
}
part_decodeattnfp8() {  # the same sweep over an FP8 KV cache at context 4k (where FP8 KV decode rows are timed)
  stage bench-decode-attention-fp8
  run ${T_DECODE_ATTN_FP8:-200} python3 benchmarks/decode_attention.py --kv-dtype fp8_e4m3 --contexts 4096 \
    --batch-sizes ${ATTN_FP8_BS:-1 64} --out "$OUT/gpu_decode_attention_fp8kv.json"
  grep -E "^(qwen3moe|llama8b) " "$LOG" | tail -6
}
part_pdlab() {  # the kernels' GPU tests and the engine's with programmatic dependent launch (the default),
  # then the GEMV's own tests
  stage tests-pdl
  run ${T_PDL_TESTS:-240} env TOKENSPEED_PDL=1 $PYT tests/gpu/test_fused_ops.py \
    tests/gpu/test_attention_backends.py tests/gpu/test_fused_moe.py tests/gpu/test_engine_gpu.py -k "not flashinfer"
  run ${T_BF16_GEMV_TESTS:-150} env TOKENSPEED_PDL=1 $PYT tests/gpu/test_bf16_gemv_gpu.py
}
part_decodeab() {  # whole decode steps plain and with each opt-in, alternating in one process per shape
  # (benchmarks/decode_ab.py)
  stage bench-decode-ab
  run ${T_DECODEAB:-150} python3 benchmarks/decode_ab.py --model qwen3moe --out "$OUT/gpu_decode_ab_qwen3moe.json"
  run ${T_DECODEAB:-150} python3 benchmarks/decode_ab.py --model llama8b --out "$OUT/gpu_decode_ab_llama8b.json"
  grep -E "speedup=|kernels/step" "$LOG" | tail -24
}
part_onelaunch() {  # decode attention in one launch (TOKENSPEED_DECODE_ONE_LAUNCH=1): its GPU tests (any split
  # may arrive last), then whole 8B decode steps PDL vs PDL + one launch, alternating in one process
  stage onelaunch
  run ${T_ONE_TESTS:-120} $PYT tests/gpu/test_attention_backends.py -k "one_launch and triton"
  run ${T_DECODEAB:-150} python3 benchmarks/decode_ab.py --model llama8b --variants pdl pdl+one \
    --batch-sizes 1 64 --out "$OUT/gpu_decode_ab_one_llama8b.json"
  grep -E "speedup=|kernels/step" "$LOG" | tail -12
}
part_moeroute() {  # the MoE GEMV's split merged by arrivals and its routing in the first launch: their GPU
  # tests, then whole Qwen3-30B-A3B decode steps: PDL, + one-launch attention, + the GEMV, + its routing
  stage moeroute
  run ${T_MOEROUTE_TESTS:-200} $PYT tests/gpu/test_moe_gemv_gpu.py -k "arrival or routing or forced"
  # the GEMV at the configurations this call's `moegemv` sweep found, when it ran first; else the committed
  local results=benchmarks/results/gpu_moe_gemv.json
  [ -f "$OUT/gpu_moe_gemv.json" ] && results="$OUT/gpu_moe_gemv.json"
  run ${T_DECODEAB_MOE:-240} python3 benchmarks/decode_ab.py --model qwen3moe \
    --variants pdl pdl+one pdl+gemv pdl+route pdl+one+route --batch-sizes 1 8 64 \
    --moe-gemv-results "$results" --out "$OUT/gpu_decode_ab_route_qwen3moe.json"
  grep -E "speedup=|kernels/step" "$LOG" | tail -36
}
part_skinny() {  # the skinny tensor-core GEMM against cuBLAS on the 8B's GEMMs at 16 and 64 rows
  # (benchmarks/skinny_gemm.py, every candidate configuration per shape and batch)
  stage bench-skinny
  run ${T_SKINNY:-300} python3 benchmarks/skinny_gemm.py --m ${SKINNY_M:-16 64} --out "$OUT/gpu_skinny_gemm.json" \
    --table-out "$OUT/dense_gemv_table.json" --table-base tokenspeed/runtime/kernels/tuned/NVIDIA_H200.json
  # where it won, whole 8B steps with those entries against without, alternating in one process
  if grep -q '"skinny"' "$OUT/dense_gemv_table.json" 2>/dev/null; then
    run ${T_DECODEAB:-150} python3 benchmarks/decode_ab.py --model llama8b --variants pdl pdl+skinny \
      --batch-sizes 16 64 --skinny-table "$OUT/dense_gemv_table.json" --out "$OUT/gpu_decode_ab_skinny_llama8b.json"
  fi
  grep -E "skinny |speed-up over|decode-step GEMMs|speedup=" "$LOG" | tail -16
}
part_pdl() {  # does programmatic dependent launch shorten a chain of decode GEMVs? (benchmarks/pdl_probe.py)
  stage bench-pdl
  run ${T_PDL:-90} python3 benchmarks/pdl_probe.py --out "$OUT/gpu_pdl_probe.json"
  grep -E "^(plain|pdl) |outputs equal" "$LOG" | tail -4
}
part_moeoffline() {  # the offline Engine per MoE configuration
  stage bench-moe-offline
  run ${T_MOE_OFFLINE:-150} python3 benchmarks/moe_offline.py --configs ${OFFLINE_CONFIGS:-default record eplb torch} \
    --out "$OUT/gpu_moe.json"
  grep -E "BEST|ratio=|kernels per MoE|kernels/step|summary|tok_s" "$LOG" | tail -40
}
part_offline() {
  stage bench-offline
  run ${T_OFFLINE:-80} python3 benchmarks/offline_throughput.py --workloads in1024_out256 --num-requests ${NREQ:-200} \
    --hf-requests 32 --hf-batch 32 --out "$OUT/gpu_offline_throughput.json"
}
part_fleet() {
  stage e2e-fleet
  # 420 s: on a fresh machine `up -d` took 185-188 s to READY (Triton compiling its kernels; the offline engine
  # on the same machine afterwards: 13 s), and the restart after kill -9 did not reach READY in the 110 s left
  # of a 300 s limit.
  run ${T_FLEET:-420} $PYT --timeout $(( ${T_FLEET:-420} - 20 )) -s tests/gpu/test_fleet_gpu.py  # teardown runs `down`
  fleet_logs
}
fleet_logs() {  # the fleet's own logs: a start that never reached READY printed nothing in the test
  local f
  for f in $(ls -t /tmp/pytest-of-*/pytest-*/test_profile_plan_up_openai_me*/state/logs/*.log 2>/dev/null | head -1); do
    { echo "--- $f"; python3 benchmarks/startup_log.py "$f"; tail -n 25 "$f"
      echo "--- supervisor"; tail -n 25 "$(dirname "$(dirname "$f")")"/supervisor.log; } >> "$LOG" 2>&1
  done
}
part_imports() {  # where start-up's "model config" and "tokenizer" seconds go on this machine: the imports they
  # pull in (-X importtime, largest cumulative first), twice (the second run has the bytecode the first wrote)
  stage imports
  for i in 1 2; do
    local t0=$(date +%s.%N)
    python3 -X importtime -c "from transformers import AutoConfig, AutoTokenizer" 2> /tmp/importtime.txt
    echo "import run $i: $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s" | tee -a "$LOG"
    sort -t'|' -k2 -n -r /tmp/importtime.txt | head -n 25 >> "$LOG"
  done
  run 60 python3 -c "
import time; t=time.monotonic()
from tokenspeed.runtime.models.model_config import ModelConfig
print('ModelConfig import', round(time.monotonic()-t, 2)); t=time.monotonic()
from tokenspeed.demo_models import demo_model_path
ModelConfig.from_pretrained(str(demo_model_path('demo')), dtype='bfloat16', device='cuda')
print('from_pretrained', round(time.monotonic()-t, 2)); t=time.monotonic()
from transformers import AutoTokenizer; AutoTokenizer.from_pretrained(str(demo_model_path('demo')))
print('AutoTokenizer', round(time.monotonic()-t, 2))"
}
part_serving() {
  stage bench-serving
  run ${T_SERVING:-200} python3 benchmarks/serving_gpu.py ${SERVING_ARGS:-} --out "$OUT/gpu_serving.json"
  grep -E "^serving|^offline|READY|goal" "$LOG" | tail -30
}
pack() {  # pack DIR NAME: ~/DIR/NAME as xz in parts under the tool's 16 MB a file ($OUT/NAME-cache.txz.partNN);
  # .whl/install.sh joins and unpacks them from tests/gpu/cache/
  tar cf - -C ~/"$1" "$2" | { xz -6 -T0 2>/dev/null || python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(sys.stdin.buffer, lzma.open(sys.stdout.buffer, "w"))'; } \
    > "/tmp/$3.txz" && split -b 15M -d "/tmp/$3.txz" "$OUT/$3.txz.part" && ls -la "$OUT/$3".txz.part* | tee -a "$LOG"
}
part_cache() { wait_warm; pack .cache flashinfer flashinfer-cache; }
# Triton's compiled kernels: carried, they spare a fresh machine the JIT of the 8B and MoE shapes' kernels
part_tritoncache() { pack .triton cache triton-cache; }

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> "$LOG" 2>&1
[ $# -gt 0 ] || set -- tests
warmed=0
for s in "$@"; do
  case $s in
    tests) parts="kernels flashinfer engine" ;;
    bench) parts="decode prefill moe offline" ;;
    e2e) parts="fleet serving" ;;
    fp8) parts="fp8gemv fp8 fp8bench" ;;
    fp8tests) parts="fp8" ;;
    verify) parts="structured spec fp8" ;;
    bf16gemv) parts="bf16gemvtests bf16gemvbench bf16gemvdecode" ;;
    moegemv) parts="moegemvtests moegemvtune" ;;
    *) parts=$s ;;
  esac
  for p in $parts; do
    case " ${done_parts:-} " in *" $p "*) continue ;; esac  # a part named twice (a stage and its group) runs once
    done_parts="${done_parts:-} $p"
    # WARM=0: no FlashInfer warm-up beside the parts (its compiles took the CPUs from a starting fleet)
    if [ $warmed = 0 ] && [ "${WARM:-1}" = 1 ] && [ $p != cache ] && [ $p != tritoncache ]; then warm; warmed=1; fi
    "part_$p"
  done
done
wait_warm
stage done
grep -E "passed|failed|error|Error" "$LOG" | tail -30
