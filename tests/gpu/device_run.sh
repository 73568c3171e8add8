#!/usr/bin/env bash
# One device-tool call: GPU tests and benchmarks, everything tee'd under $OUT.
#   source .whl/install.sh && bash tests/gpu/device_run.sh [tests|bench|offline|all]...
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
stage() { echo "=== $1 $(date -u +%T)"; }
for what in "${@:-all}"; do
  case $what in
    tests)
      stage warm-flashinfer
      for fam in prefill decode sampling; do
        python3 tests/gpu/warm_flashinfer.py $fam > "$OUT/warm_$fam.log" 2>&1 &
      done
      stage tests-triton
      python3 -m pytest -m gpu tests/gpu -q -x -k "not flashinfer" -p no:cacheprovider --timeout 300 2>&1 \
        | tee "$OUT/tests_triton.log" | tail -40
      wait
      tail -n 3 "$OUT"/warm_*.log
      stage tests-flashinfer
      python3 -m pytest -m gpu tests/gpu -q -k "flashinfer" -p no:cacheprovider --timeout 300 2>&1 \
        | tee "$OUT/tests_flashinfer.log" | tail -40
      tar czf "$OUT/flashinfer-cache.tgz" -C ~/.cache flashinfer && ls -la "$OUT/flashinfer-cache.tgz"
      ;;
    bench)
      stage decode
      python3 benchmarks/decode.py --out "$OUT/gpu_decode.json" 2>&1 | tee "$OUT/bench_decode.log" | grep -v "^\s*$" | tail -50
      stage prefill
      python3 benchmarks/prefill.py --out "$OUT/gpu_prefill.json" 2>&1 | tee "$OUT/bench_prefill.log" | tail -20
      ;;
    offline)
      stage offline
      python3 benchmarks/offline_throughput.py --num-requests "${NREQ:-300}" --out "$OUT/gpu_offline_throughput.json" 2>&1 \
        | tee "$OUT/bench_offline.log" | tail -20
      ;;
  esac
done
stage done
