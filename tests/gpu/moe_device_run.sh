#!/usr/bin/env bash
# One device-tool call for the MoE path: GPU tests, the kernel block-size sweep, the decode roofline rows
# and the offline Engine per configuration; one log ($OUT/run.log) and the results JSON come back.
#   source .whl/install.sh && STAGES="tests tune decode" bash tests/gpu/moe_device_run.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
LOG="$OUT/run.log"
stage() { echo "=== $1 $(date -u +%T)" | tee -a "$LOG"; }
run() { local t=$1; shift; timeout "$t" "$@" >> "$LOG" 2>&1; echo "--- exit $? ($*)" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> "$LOG" 2>&1
for s in ${STAGES:-tests tune decode offline}; do
  case $s in
    tests) stage tests
      run "${T_TESTS:-90}" python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts= tests/gpu/test_fused_moe.py ;;
    tune) stage tune
      run "${T_TUNE:-60}" python3 benchmarks/moe_tune.py --tokens ${TUNE_TOKENS:-1 4 16 64 256} --out "$OUT/gpu_moe_tune.json" ;;
    decode) stage decode
      run "${T_DECODE:-100}" python3 benchmarks/decode.py --model qwen3moe --backends triton \
        --moe-configs ${MOE_CONFIGS:-default record} --contexts 1024 --batch-sizes 1 16 64 256 \
        --max-total-tokens 300000 --out "$OUT/gpu_decode_qwen3moe.json" ;;
    offline) stage offline
      run "${T_OFFLINE:-150}" python3 benchmarks/moe_offline.py --configs ${OFFLINE_CONFIGS:-default record eplb torch} \
        --out "$OUT/gpu_moe.json" ;;
  esac
done
stage done
grep -E "passed|failed|FAILED|Error|BEST|ratio=|kernels per MoE|kernels/step|summary|tok_s" "$LOG" | tail -70
