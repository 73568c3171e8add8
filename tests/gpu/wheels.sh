#!/usr/bin/env bash
# Prepare ./.whl in the project root: the wheels the GPU machine lacks (tests/gpu/wheels.txt) and .whl/install.sh.
# Run from the project root:   bash tests/gpu/wheels.sh [EXTRA_PKG==VER ...]
# Then start every device command with   source .whl/install.sh && ...   and carry [".whl"].
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
mkdir -p .whl
mapfile -t pkgs < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' tests/gpu/wheels.txt)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${pkgs[@]}" "$@"
cat > .whl/install.sh <<'INNER'
# Sourced on the GPU machine from the project root.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# FlashInfer's JIT cache for the H200 (sm_90a, flashinfer-python 0.6.0, bf16, head_dim 128: prefill, decode and
# sampling), brought back by `device_run.sh cache` as xz parts and kept in tests/gpu/cache/, so it travels with the
# tree and no kernel family compiles on a fresh machine (prefill and sampling took ~90 s each). xz packs it to a
# quarter of gzip's size: the tree, the wheels and the cache must stay under the device tool's 64 MiB.
unpack() {  # unpack NAME DEST: tests/gpu/cache/NAME-cache.txz.part* (from `device_run.sh cache|tritoncache`) into DEST
  ls tests/gpu/cache/"$1"-cache.txz.part* >/dev/null 2>&1 || return 0
  mkdir -p "$2" && cat tests/gpu/cache/"$1"-cache.txz.part* \
    | python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)' \
    | tar xf - -C "$2"
}
unpack flashinfer ~/.cache
# Each carried module's .so goes where FlashInfer looks for ahead-of-time builds (flashinfer/data/aot/NAME/NAME.so),
# which it loads without running ninja. Through ninja the carried sampling family compiled again (~100 s) in every
# process: its .ninja_deps had been cut short by builds running side by side ("deps for sampling.cuda.o are
# missing"), and processes starting together then rebuilt it in the same folder, each spoiling the other's deps.
for so in ~/.cache/flashinfer/*/*/cached_ops/*/*.so; do
  [ -e "$so" ] || continue
  name=$(basename "$(dirname "$so")")
  mkdir -p "/tmp/site/flashinfer/data/aot/$name" && cp "$so" "/tmp/site/flashinfer/data/aot/$name/$name.so"
done
# Triton's kernel cache from `device_run.sh tritoncache` (triton 3.6, sm_90), when tests/gpu/cache holds one: the
# kernels the 8B and MoE shapes compile, so a fresh machine does not spend them in Triton's JIT. Worth carrying
# only while those kernels are unchanged (docs/GPU.md).
unpack triton ~/.triton
INNER
du -sh .whl
