#!/usr/bin/env bash
# bench/gpu/decode.sh [SHARED_DIR] - issue 16's decode milestone in one run on a machine with an
# NVIDIA GPU (the lent H200): build with the CUDA backend; generate the Llama-3.1-8B-shaped bf16
# model (kiln gen-model --preset llama3.1-8b, all cores, into /dev/shm) while the CUDA tests run
# (ctest -L cuda); the device's copy bandwidth and the matmul kernels on the 8B layer shapes
# (gpu_matmul_bench), torch.matmul (cuBLAS) on the same shapes (torch_gemm.py); then kiln bench
# at concurrency 1: batch-1 decode at 128, 1024 and 8192 tokens of context, TTFT of the
# 1024-token prompt, prefill tok/s of the 8192-token prompt; the same at 128 without CUDA
# graphs; the per-operation time split (KILN_CUDA_PROFILE=1) at 128 and 8192, and at 128 with the
# first milestone's kernels (KILN_CUDA_KERNELS=v1, "before"); the same for Q8_0 / Q4_0 models
# (QTYPES).
# SHARED_DIR: the reference data for the tests (default ../shared). Logs: see below. Env:
# KILN_8B_MODEL (the bf16 model's path), KILN_RUN_LIBS (a folder of the
# server's shared libraries when the machine lacks them, as for check.sh), SKIP_TESTS=1,
# SKIP_TORCH=1, SKIP_PROF=1 (no per-operation split), MORE=1 (also: without programmatic launch,
# and the first milestone's kernels), SKIP_TC=1 (no tensor-core benches; by default the
# tensor-core matmul, KILN_CUDA_TC=1, is timed beside the default), QTYPES="q8_0 q4_0" (the
# quantized 8B models to generate and time too: gpu_matmul_bench and kiln bench at 128, 1024 and
# 8192; default none), CTX="128 1024 8192" (the prompts the default kernels are timed at),
# SKIP_BF16=1 (only the QTYPES models: no bf16 model, matmul or bench), SKIP_MEMCHECK=1.
# The figures it printed are in README.md here.
set -uo pipefail
cd "$(dirname "$0")/../.."
shared="$(cd "${1:-../shared}" && pwd)"
# every log under gpu-decode-out/; when $OUT is set (the lent machine, which returns at most 8
# files from it), each log is also appended to $OUT/all.log as it completes and stdout is
# copied to $OUT/summary.txt
out="$PWD/gpu-decode-out"
mkdir -p "$out"
if [ -n "${OUT:-}" ]; then exec > >(tee -a "$OUT/summary.txt") 2>&1; fi
keep() { [ -n "${OUT:-}" ] && { echo "===== $1"; cat "$1"; } >>"$OUT/all.log" 2>&1; }
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -2
cat COMMIT 2>/dev/null || git log -1 --format="commit %H" 2>/dev/null || true
nproc=$(nproc)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_SHARED_DIR="$shared" \
  >"$out/configure.txt" 2>&1 || { tail -30 "$out/configure.txt"; exit 1; }
cmake --build build-gpu -j"$nproc" --target kiln gpu_matmul_bench test_cuda_ops test_cuda_logits test_cuda_gpu_memory \
  test_engine_invariance_stories260K test_engine_prefix_cache_stories260K-f32 test_llama2c_greedy \
  >"$out/build.txt" 2>&1 || { keep "$out/build.txt"; grep -E "error|Error" "$out/build.txt" | head -40; exit 1; }
say "built"
run_env=()
if ldd build-gpu/kiln | grep -q "not found"; then
  [ -n "${KILN_RUN_LIBS:-}" ] && run_env=(env "LD_LIBRARY_PATH=$KILN_RUN_LIBS:${LD_LIBRARY_PATH:-}")
fi
kiln() { "${run_env[@]}" ./build-gpu/kiln "$@"; }

# the model (16.06 GB) in /dev/shm when it has room (reads at memory speed), else beside the build
shm_free=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
if [ "${shm_free:-0}" -gt $((20 * 1024 * 1024)) ]; then dflt=/dev/shm/llama3.1-8b-bf16.gguf
else dflt=$PWD/build-gpu/llama3.1-8b-bf16.gguf; fi
model="${KILN_8B_MODEL:-$dflt}"
qtypes="${QTYPES:-}"
qmodel() { echo "$(dirname "$model")/llama3.1-8b-$1.gguf"; }
# one generator after the other (each takes every core), behind the tests
(
  [ -f "$model" ] || [ "${SKIP_BF16:-0}" = 1 ] ||
    kiln gen-model --preset llama3.1-8b --type bf16 -t "$nproc" -o "$model"
  for t in $qtypes; do
    [ -f "$(qmodel "$t")" ] || kiln gen-model --preset llama3.1-8b --type "$t" -t "$nproc" -o "$(qmodel "$t")"
  done
) >"$out/gen.txt" 2>&1 &
gen_pid=$!

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  (cd build-gpu && ctest -L cuda -j3 -V --timeout 150 >"$out/ctest.txt" 2>&1)
  rc=$?
  keep "$out/ctest.txt"
  grep -E "max\||largest|bitwise|greedy|refused|skipped|CHECK failed|REQUIRE failed|differ|DIFFER|tests passed|Test +#|\*\*\*" \
    "$out/ctest.txt" | sed -E 's/^[0-9]+: //' | grep -v "^ *Start" | head -90
  say "ctest rc=$rc"
fi

if [ -n "$gen_pid" ]; then
  wait "$gen_pid"
  say "gen-model rc=$?: $(tail -1 "$out/gen.txt")"
  keep "$out/gen.txt"
fi
ls -la "$model" $(for t in $qtypes; do qmodel "$t"; done) 2>&1

# the tensor-core matmul (KILN_CUDA_TC=1) for the bf16 weights: the kernels torch_gemm.py compares
if [ "${SKIP_TC:-0}" != 1 ]; then
  KILN_CUDA_TC=1 ./build-gpu/bench/gpu_matmul_bench >"$out/gemv.txt" 2>&1
  say "gpu_matmul_bench rc=$?"
  keep "$out/gemv.txt"
  cat "$out/gemv.txt"
fi
# the default kernels, bf16 and each quantized type, up to 16 rows
wtypes="bf16 $qtypes"
[ "${SKIP_BF16:-0}" = 1 ] && wtypes="$qtypes"
for t in $wtypes; do
  KILN_BENCH_WTYPE=$t ./build-gpu/bench/gpu_matmul_bench 1 2 4 8 16 >"$out/gemv-$t.txt" 2>&1
  say "gpu_matmul_bench $t rc=$?"
  keep "$out/gemv-$t.txt"
  cat "$out/gemv-$t.txt"
done
if [ "${SKIP_TORCH:-0}" != 1 ] && env -u LD_LIBRARY_PATH python3 -c 'import torch' 2>/dev/null; then
  env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 timeout 120 python3 bench/gpu/torch_gemm.py "$out/gemv.txt" >"$out/torch.txt" 2>&1
  say "torch_gemm rc=$?"
  keep "$out/torch.txt"
  cat "$out/torch.txt"
fi

# kiln bench at concurrency 1: LABEL PROMPT GEN [env...]
bench() {
  local label=$1 prompt=$2 gen=$3
  shift 3
  local m="$model"
  case "$label" in *-q8_0) m=$(qmodel q8_0) ;; *-q4_0) m=$(qmodel q4_0) ;; esac
  timeout 120 "${run_env[@]}" env "$@" ./build-gpu/kiln bench -m "$m" --device cuda --concurrency 1 \
    --prompt-tokens "$prompt" --gen-tokens "$gen" --kv-type bf16 --no-prefix-cache \
    >"$out/bench-$label.txt" 2>&1
  local rc=$?
  keep "$out/bench-$label.txt"
  echo "== $label (prompt $prompt, gen $gen${*:+, $*}) rc=$rc"
  grep -E "^kiln bench:|concurrency|^ +1 " "$out/bench-$label.txt"
  grep -A60 "kiln cuda profile" "$out/bench-$label.txt" | head -60
}
for c in ${CTX:-128 1024 8192}; do
  [ "${SKIP_BF16:-0}" = 1 ] || bench ctx$c $c 128
  for t in $qtypes; do bench ctx$c-$t $c 128; done
done
[ "${SKIP_BF16:-0}" = 1 ] || bench ctx128-nographs 128 128 KILN_CUDA_GRAPHS=0

[ "${MORE:-0}" = 1 ] && bench ctx128-nopdl 128 128 KILN_CUDA_PDL=0
# the per-operation split: graphed decode steps timed by event nodes inside the graphs (no
# programmatic launch overlap then), prefill chunks as launched
if [ "${SKIP_PROF:-0}" != 1 ]; then
  bench prof-ctx128 128 64 KILN_CUDA_PROFILE=1 KILN_CUDA_PDL=0
  bench prof-ctx8192 8192 32 KILN_CUDA_PROFILE=1 KILN_CUDA_PDL=0
fi
# the tensor-core matmul for the bf16 weights (opt-in): TTFT, prefill and decode
if [ "${SKIP_TC:-0}" != 1 ]; then
  bench ctx128-tc 128 128 KILN_CUDA_TC=1
  bench ctx1024-tc 1024 128 KILN_CUDA_TC=1
  bench ctx8192-tc 8192 128 KILN_CUDA_TC=1
fi
# the first milestone's kernels ("before"; README.md: aborts since run 2, see there)
[ "${MORE:-0}" = 1 ] && bench prof-ctx128-v1 128 32 KILN_CUDA_PROFILE=1 KILN_CUDA_KERNELS=v1
say "benches done"
if command -v compute-sanitizer >/dev/null 2>&1 && [ "${SKIP_TESTS:-0}" != 1 ] &&
  [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/cuda/test_cuda_ops \
    >"$out/memcheck.txt" 2>&1
  echo "memcheck test_cuda_ops rc=$?: $(grep -E "ERROR SUMMARY" "$out/memcheck.txt" | head -1)"
  grep -E "Invalid|Race" "$out/memcheck.txt" | head -5
  keep "$out/memcheck.txt"
fi

say "total"
