#!/usr/bin/env bash
# One device-tool call: GPU tests and benchmarks; one log ($OUT/run.log), the results JSON and the
# FlashInfer JIT cache come back (the tool returns at most 8 files).
#   source .whl/install.sh && bash tests/gpu/device_run.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
LOG="$OUT/run.log"
stage() { echo "=== $1 $(date -u +%T)" | tee -a "$LOG"; }
run() { local t=$1; shift; timeout "$t" "$@" >> "$LOG" 2>&1; echo "--- exit $? ($*)" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> "$LOG" 2>&1
stage warm-flashinfer
for fam in prefill decode sampling; do
  (timeout 240 python3 tests/gpu/warm_flashinfer.py $fam > /tmp/warm_$fam.log 2>&1; tail -n 2 /tmp/warm_$fam.log >> "$LOG") &
done
PYT="python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts= --timeout 120"
stage tests-kernels
run ${T_KERNELS:-120} $PYT tests/gpu/test_attention_backends.py tests/gpu/test_fused_ops.py tests/gpu/test_gpu_samplers.py -k "not flashinfer"
stage bench-decode
run ${T_DECODE:-150} python3 benchmarks/decode.py --backends triton flashinfer --out "$OUT/gpu_decode.json"
grep -E "bandwidth|ratio=|eager" "$LOG" | tail -45
stage bench-prefill
run ${T_PREFILL:-60} python3 benchmarks/prefill.py --out "$OUT/gpu_prefill.json"
grep -E "peak|share=" "$LOG" | tail -14
wait
stage tests-flashinfer
run ${T_FI:-60} $PYT tests/gpu/test_attention_backends.py tests/gpu/test_gpu_samplers.py -k "flashinfer"
tar czf "$OUT/flashinfer-cache.tgz" -C ~/.cache flashinfer && ls -la "$OUT/flashinfer-cache.tgz" | tee -a "$LOG"
stage tests-engine
run ${T_ENGINE:-100} $PYT tests/gpu/test_engine_gpu.py tests/gpu/test_fused_moe.py
stage bench-decode-moe
run ${T_MOE:-90} python3 benchmarks/decode.py --model qwen3moe --backends triton --contexts 1024 \
  --batch-sizes 1 4 16 64 256 --max-total-tokens 300000 --out "$OUT/gpu_decode_qwen3moe.json"
stage bench-offline
run ${T_OFFLINE:-80} python3 benchmarks/offline_throughput.py --workloads in1024_out256 --num-requests ${NREQ:-200} \
  --hf-requests 32 --hf-batch 32 --out "$OUT/gpu_offline_throughput.json"
stage done
grep -E "passed|failed|error|Error" "$LOG" | tail -30
grep -E "speedup|transformers \{" "$LOG" | tail -4
