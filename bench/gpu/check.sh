#!/usr/bin/env bash
# bench/gpu/check.sh [SHARED_DIR] - on a machine with an NVIDIA GPU: configure and build kiln
# with the CUDA backend, run every CUDA test (ctest -L cuda), the op test again under
# compute-sanitizer (when it is installed), and compare `kiln run` tok/s on pycode10M on the
# GPU and the CPU. SHARED_DIR is the reference data (default ../shared). Logs go to $OUT (or
# ./gpu-check-out) as well as stdout. Issue 16; the figures it printed are in README.md here.
set -uo pipefail
cd "$(dirname "$0")/../.."
shared="$(cd "${1:-../shared}" && pwd)"
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
git log -1 --format='commit %H' 2>/dev/null || true
t0=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_SHARED_DIR="$shared" \
  >"$out/configure.txt" 2>&1 || { tail -30 "$out/configure.txt"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target kiln test_cuda_ops test_cuda_logits test_cuda_gpu_memory \
  test_engine_invariance_stories260K test_engine_prefix_cache_stories260K-f32 test_llama2c_greedy >"$out/build.txt" 2>&1 ||
  { grep -E "error|Error" "$out/build.txt" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
(cd build-gpu && ctest -L cuda -V --timeout 300 >"$out/ctest.txt" 2>&1)
rc=$?
# the figures each test printed, and the verdicts
grep -E "max\||largest|bitwise|greedy|refused|skipped|CHECK failed|REQUIRE failed|differ|Passed|Failed|\*\*\*|tests passed" \
  "$out/ctest.txt" | sed -E 's/^[0-9]+: //' | head -120
if command -v compute-sanitizer >/dev/null 2>&1; then
  echo "== compute-sanitizer memcheck: test_cuda_ops"
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/cuda/test_cuda_ops \
    >"$out/memcheck.txt" 2>&1
  echo "memcheck rc=$? ($(grep -c "Invalid\|ERROR SUMMARY" "$out/memcheck.txt") lines of errors/summary)"
  grep -E "ERROR SUMMARY|Invalid" "$out/memcheck.txt" | head -5
fi
# the kiln binary links libmicrohttpd (and through it gnutls): on a machine missing one of
# those, env KILN_RUN_LIBS names a folder of them, used for these runs only
run_env=()
if ldd build-gpu/kiln | grep -q "not found"; then
  echo "kiln binary: missing $(ldd build-gpu/kiln | grep "not found" | awk '{print $1}' | tr '\n' ' ')"
  [ -n "${KILN_RUN_LIBS:-}" ] && run_env=(env "LD_LIBRARY_PATH=$KILN_RUN_LIBS:${LD_LIBRARY_PATH:-}")
fi
m="$shared/models/pycode10M"
p="def fibonacci(n):"
for dev in cuda cpu; do
  for rep in 1 2; do
    "${run_env[@]}" ./build-gpu/kiln run -m "$m" -p "$p" -n 256 --temp 0 --device "$dev" --no-prefix-cache \
      >"$out/run-$dev.txt" 2>"$out/run-$dev.err"
    echo "kiln run pycode10M --device $dev (#$rep): $(tail -1 "$out/run-$dev.err")"
  done
done
for dev in cuda cpu; do
  echo "kiln bench pycode10M --device $dev (128 prompt + 64 generated tokens per request):"
  "${run_env[@]}" ./build-gpu/kiln bench -m "$m" --device "$dev" --concurrency 1,16,64 \
    --prompt-tokens 128 --gen-tokens 64 --no-prefix-cache 2>&1 | tail -5
done
cmp -s "$out/run-cuda.txt" "$out/run-cpu.txt" && echo "greedy text: cuda == cpu" ||
  echo "greedy text: cuda != cpu"
echo "total: $(( $(date +%s) - t0 )) s; ctest rc=$rc"
exit $rc
