#!/usr/bin/env bash
# On a machine with a CUDA GPU: build iekit with its CUDA kernels into the
# current Python environment, run the tests marked `gpu` and the GPU
# benchmarks, and keep every log under $OUT (default out/gpu). Stages:
#   build | test | gemv | decode   (default: all four, in that order)
# Wheels of missing pure dependencies may sit in .whl/ (installed first, no index).
# All four stages take about 4 minutes on an H200 (build 1 min, tests 0.5, every
# type's GEMV at batches 1-8 1, decode 1.5); GEMV_ARGS=--sweep also times every
# split (much longer).
#   bash benchmarks/gpu_check.sh [stage ...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
stages=${*:-build test gemv decode}
export PYTHONUNBUFFERED=1
for s in $stages; do
  echo "=== $s" | tee -a "$OUT/summary.txt"
  case $s in
    build)
      if ls .whl/*.whl >/dev/null 2>&1; then $PY -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 1; fi
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/summary.txt"
      /usr/bin/time -f "build: %e s" $PY -m pip install -q --no-build-isolation --no-deps --no-compile \
        -Ccmake.define.IE_ENABLE_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 -Cbuild-dir=build/cuda-gpu . \
        > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
      tail -1 "$OUT/build.log" | tee -a "$OUT/summary.txt"
      $PY -c "from iekit.runtime import cuda; print('cuda:', cuda.unavailable() or 'ok')" | tee -a "$OUT/summary.txt" ;;
    test)
      $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py tests/test_cuda_decoder.py -x -rs \
        > "$OUT/test.log" 2>&1
      tail -15 "$OUT/test.log" | tee -a "$OUT/summary.txt" ;;
    gemv)
      $PY benchmarks/cuda_gemv.py ${GEMV_ARGS:---batches 1,2,4,8 --iters 10 --min-mb 256} --json-out "$OUT/gemv.json" \
        > "$OUT/gemv.log" 2>&1
      grep -v '^{' "$OUT/gemv.log" | tee -a "$OUT/summary.txt" ;;
    decode)
      $PY benchmarks/decode_bench.py --device cuda --size large > "$OUT/decode.log" 2>&1
      tail -3 "$OUT/decode.log" | tee -a "$OUT/summary.txt" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
