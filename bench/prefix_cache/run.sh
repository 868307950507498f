#!/usr/bin/env bash
# The prefix cache's speed goals (issue 13), on a tinyllama-1.1b-shaped Q4_0 model from
# `kiln gen-model` (seed 1), CPU, 2 threads:
#   1. 16 clients share a 2016-token prefix (+ 16 unique tokens each, 16 generated):
#      TTFT p50 with the cache <= 1/10 of the TTFT without it;
#   2. the first request after a restart (its prefix read from --cache-dir) has a TTFT
#      <= 1/5 of one uncached request alone;
#   and the disk read rate reached (bytes read / restart TTFT: a lower bound, since the TTFT
#   also computes the suffix; the files were just written, so mostly from the page cache).
# usage: bench/prefix_cache/run.sh [BUILD_DIR] [WORK_DIR]   (about 6 minutes on 2 cores)
set -euo pipefail
build=${1:-build}
work=${2:-/tmp/kiln-bench-prefix}
kiln="$build/kiln"
mkdir -p "$work"
model="$work/tinyllama-q4_0.gguf"
[ -f "$model" ] || "$kiln" gen-model --preset tinyllama-1.1b --type q4_0 --seed 1 -o "$model" -t 2
common=(-m "$model" -t 2 --shared-prefix 2016 --suffix-tokens 16 --gen-tokens 16 --json)
rm -rf "$work/c16" "$work/c1"
"$kiln" bench "${common[@]}" --clients 16 --requests 16 --cache-dir "$work/c16" > "$work/c16.json"
"$kiln" bench "${common[@]}" --clients 1 --requests 3 --cache-dir "$work/c1" > "$work/c1.json"
python3 - "$work/c16.json" "$work/c1.json" <<'PY'
import json, sys
c16 = {p["phase"]: p for p in json.load(open(sys.argv[1]))["phases"]}
c1 = {p["phase"]: p for p in json.load(open(sys.argv[2]))["phases"]}
for name, d in (("16 clients", c16), ("1 client", c1)):
    for ph in ("off", "on", "restart"):
        p = d[ph]
        print(f"{name:10s} {ph:8s} TTFT p50 {p['ttft_ms_p50']:10.1f} ms  p99 {p['ttft_ms_p99']:10.1f} ms"
              f"  cached/req {p['cached_tokens_per_request']:6.0f}  disk reads {p['disk_reads']}")
r1 = c16["on"]["ttft_ms_p50"] / c16["off"]["ttft_ms_p50"]
r2 = c1["restart"]["ttft_ms_p50"] / c1["off"]["ttft_ms_p50"]
rate = c1["restart"]["disk_read_bytes"] / (c1["restart"]["ttft_ms_p50"] / 1e3) / 1e6
print(f"16 clients: TTFT p50 cached / uncached = {r1:.4f} (goal <= 0.1): {'ok' if r1 <= 0.1 else 'MISSED'}")
print(f"restart: first-request TTFT / uncached alone = {r2:.4f} (goal <= 0.2): {'ok' if r2 <= 0.2 else 'MISSED'}")
print(f"disk read rate >= {rate:.0f} MB/s ({c1['restart']['disk_read_bytes']} bytes)")
PY
