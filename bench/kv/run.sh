#!/bin/sh
# bench/kv/run.sh - decode speed and KV memory per KV page format (issue 14).
#
# A tinyllama-1.1b-shaped Q4_0 model (kiln gen-model, random weights: speed only), CPU,
# THREADS threads (default 2), one request of PROMPT (default 4096) prompt tokens and GEN
# (default 32) generated ones: decode tok/s at ~4k-token context with f16, q8_0, q4_0 and
# TurboQuant turbo:k8v3 KV (FORMATS to choose; any --kv-type value).
# The formats run interleaved (f16, q8_0, q4_0, turbo:k8v3, f16, ...) for ROUNDS rounds
# (default 3); the medians of per-request decode tok/s print with the KV bytes per token and
# for the sequence, and each format's ratio to f16. The machine's load (uptime) prints
# before and after: on a shared machine, read the figures with it.
# BASE=/path/to/other/kiln runs that binary too, interleaved with this build's (each format:
# this build, then BASE), and prints this build / BASE per format: an A/B of two builds in one
# run (e.g. a checkout of main). Environment such as KILN_SIMD=avx2 applies to both.
#
# usage: bench/kv/run.sh [BUILD_DIR]   (env: ROUNDS, THREADS, PROMPT, GEN, MODEL, OUT, FORMATS, BASE)
set -eu
BUILD=${1:-build}
KILN=$BUILD/kiln
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-4096}
GEN=${GEN:-32}
OUT=${OUT:-/tmp/kiln-bench-kv}
FORMATS=${FORMATS:-f16 q8_0 q4_0 turbo:k8v3}
MODEL=${MODEL:-$OUT/tinyllama-1.1b-q4_0.gguf}
BASE=${BASE:-}
mkdir -p "$OUT"
if [ ! -f "$MODEL" ]; then
    "$KILN" gen-model --preset tinyllama-1.1b --type q4_0 --seed 1 -o "$MODEL"
fi
echo "load before: $(uptime)"
: > "$OUT/runs.jsonl"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for kv in $FORMATS; do
        for bin in "$KILN" $BASE; do
            "$bin" bench -m "$MODEL" --concurrency 1 --prompt-tokens "$PROMPT" --gen-tokens "$GEN" \
                -t "$THREADS" --kv-type "$kv" --no-prefix-cache --json |
                python3 -c 'import json,sys; o=json.load(sys.stdin); l=o["levels"][0]; print(json.dumps({"round": '"$r"', "bin": "'"$bin"'", "kv": "'"$kv"'", "decode_tok_s": l["per_request_gen_tok_s"], "prefill_tok_s": l["prefill_tok_s"], "kv_bytes_per_token": o["kv_bytes_per_token"]}))' |
                tee -a "$OUT/runs.jsonl"
        done
    done
    r=$((r + 1))
done
echo "load after: $(uptime)"
python3 - "$OUT/runs.jsonl" "$PROMPT" "$GEN" "$KILN" "$BASE" $FORMATS <<'PY'
import json, statistics, sys
allruns = [json.loads(l) for l in open(sys.argv[1])]
runs = [r for r in allruns if r.get("bin", sys.argv[4]) == sys.argv[4]]
ctx = int(sys.argv[2]) + int(sys.argv[3])
fmts = sys.argv[6:]
med = {}
for kv in fmts:
    rs = [r for r in runs if r["kv"] == kv]
    d = statistics.median(r["decode_tok_s"] for r in rs)
    b = rs[0]["kv_bytes_per_token"]
    med[kv] = (d, b)
    print(f"{kv:10s} decode median {d:7.2f} tok/s over {len(rs)} runs "
          f"({', '.join('%.2f' % r['decode_tok_s'] for r in rs)}); KV {b:.0f} bytes/token, "
          f"{b * ctx / 2**20:.1f} MiB for the {ctx}-token sequence")
for kv in (k for k in fmts if k != "f16" and "f16" in med):
    print(f"{kv} / f16: decode {med[kv][0] / med['f16'][0]:.3f}x, KV memory "
          f"{med[kv][1] / med['f16'][1]:.3f}x")
if sys.argv[5]:
    for kv in fmts:
        bs = [r["decode_tok_s"] for r in allruns if r["kv"] == kv and r["bin"] == sys.argv[5]]
        b = statistics.median(bs)
        print(f"{kv:10s} BASE {sys.argv[5]} decode median {b:7.2f} tok/s "
              f"({', '.join('%.2f' % x for x in bs)}); this build / BASE {med[kv][0] / b:.3f}x")
PY
