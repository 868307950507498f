#!/usr/bin/env bash
# KV page formats against llama.cpp, same file and same text (issue 14, Acceptance "Quality
# against llama.cpp"):
#   - pycode10M (../shared/models/pycode10M, a real 10M Llama trained on Python, head size 64,
#     GQA 2:1) converted by `kiln convert --type f32` (tokenizer.json carried into the GGUF);
#   - the text: pycode10M's held-out valid.txt, whole (200 kB, 55723 tokens: 108 chunks of
#     512), or TEXT=...;
#   - kiln perplexity --ctx 512 with f16, q8_0, q4_0 (and f32) KV pages, and llama.cpp's
#     llama-perplexity -c 512 -fa with -ctk/-ctv f16, q8_0, q4_0 (and f32 without -fa), with
#     --no-escape (llama-perplexity otherwise rewrites backslash escapes such as "\n" inside
#     the Python source before tokenizing), -b 512 (one chunk per batch) and
#     --ppl-output-type 1 (its mean NLL to 6 decimals; ppl = exp of it);
#   - TurboQuant configurations (kiln only) when the build knows `--kv-type turbo:...`:
#     turbo:k8v3 (the default config), k4v4, k4v3 and k3v3 (3.5 bits per channel with the
#     per-head f32 norms, the paper's "quality neutral" point); TURBO="turbo:k8v3 ..." to choose;
#   - each format's KV bytes per token and bits per element, norms and scales included, from
#     `kiln fit --json` (the pool's arithmetic).
# Prints a table of ppl and relative change from f16 per engine and format, and checks that
# kiln's relative change from f16 is no worse (no larger an increase) than llama.cpp's for
# q8_0 and q4_0; exit 1 otherwise.
# usage: LLAMA_CPP_DIR=/path/to/llama.cpp bench/kv/perplexity.sh [BUILD_DIR] [WORK_DIR]
#   LLAMA_CPP_DIR  a llama.cpp checkout built with llama-perplexity (build/bin/); unset: kiln
#                  only. THREADS (default 2), CTX (512), CHUNKS (all), TEXT, TURBO.
# About 2 minutes per run at ctx 512 on 2 loaded cores; 8 runs.
set -euo pipefail
build=${1:-build}
work=${2:-/tmp/kiln-bench-kv-ppl}
kiln="$build/kiln"
here=$(cd "$(dirname "$0")" && pwd)
shared=${KILN_SHARED_DIR:-$here/../../../shared}
threads=${THREADS:-2}
ctx=${CTX:-512}
text=${TEXT:-$shared/models/pycode10M/valid.txt}
mkdir -p "$work"
gguf="$work/pycode10M-f32.gguf"
[ -f "$gguf" ] || "$kiln" convert "$shared/models/pycode10M" "$gguf" --type f32 >&2
chunk_args=()
[ -n "${CHUNKS:-}" ] && chunk_args=(--chunks "$CHUNKS")
echo "load: $(uptime)" >&2
echo "text: $text ($(wc -c < "$text") bytes), ctx $ctx, threads $threads" >&2

declare -A KP LP
kiln_run() { # format
    local out
    out=$("$kiln" perplexity -m "$gguf" -f "$text" --ctx "$ctx" --kv-type "$1" -t "$threads" \
          "${chunk_args[@]}" --json 2>/dev/null) || return 1
    python3 -c 'import json,sys; print("%.6f" % json.loads(sys.argv[1])["ppl"])' "$out"
}
llama_run() { # format [extra...]
    local kv=$1; shift
    local lp="$LLAMA_CPP_DIR/build/bin/llama-perplexity" args=()
    [ -n "${CHUNKS:-}" ] && args=(--chunks "$CHUNKS")
    # --ppl-output-type 1: per chunk "offset ppl mean-nll stderr" with the mean NLL to 6
    # decimals (the default output rounds ppl to 4); ppl = exp(the last mean NLL)
    "$lp" -m "$gguf" -f "$text" -c "$ctx" -b "$ctx" -t "$threads" --no-escape -ctk "$kv" \
        -ctv "$kv" --ppl-output-type 1 "$@" "${args[@]}" > "$work/llama-$kv.log" 2>&1 || return 1
    grep -q "Final estimate" "$work/llama-$kv.log" || return 1
    awk 'NF == 4 && $1 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ { nll = $3 } END { printf "%.6f\n", exp(nll) }' \
        "$work/llama-$kv.log"
}
formats=(f16 q8_0 q4_0 f32)
for f in "${formats[@]}"; do
    KP[$f]=$(kiln_run "$f") || KP[$f]=""
    echo "kiln $f: ${KP[$f]}" >&2
done
turbo=${TURBO:-}
if [ -z "$turbo" ] && "$kiln" perplexity --help 2>&1 | grep -q turbo; then
    turbo="turbo:k8v3 turbo:k4v4 turbo:k4v3 turbo:k3v3"
fi
for t in $turbo; do
    KP[$t]=$(kiln_run "$t") || KP[$t]=""
    echo "kiln $t: ${KP[$t]}" >&2
done
declare -A KB
for f in "${!KP[@]}"; do # KV bytes per token of each format (kiln fit: the pool's arithmetic)
    KB[$f]=$("$kiln" fit -m "$gguf" --ctx "$ctx" --kv-type "$f" --memory 1G --bandwidth 10 --json |
             python3 -c 'import json,sys; print(json.load(sys.stdin)["kv_bytes_per_token"])') || KB[$f]=""
done
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
    git -C "$LLAMA_CPP_DIR" log -1 --format='llama.cpp %H %cd' >&2 || true
    for f in f16 q8_0 q4_0; do
        LP[$f]=$(llama_run "$f" -fa) || LP[$f]=""
        echo "llama.cpp $f -fa: ${LP[$f]}" >&2
    done
    LP[f32]=$(llama_run f32) || LP[f32]=""
    echo "llama.cpp f32: ${LP[f32]}" >&2
fi
echo "load: $(uptime)" >&2
python3 - "$ctx" "$text" <<EOF
import sys
kp = {$(for k in "${!KP[@]}"; do printf '"%s": "%s", ' "$k" "${KP[$k]}"; done)}
lp = {$(for k in "${!LP[@]}"; do printf '"%s": "%s", ' "$k" "${LP[$k]}"; done)}
kb = {$(for k in "${!KB[@]}"; do printf '"%s": "%s", ' "$k" "${KB[$k]}"; done)}
fl = lambda d, k: float(d[k]) if d.get(k) else None
order = ["f32", "f16", "q8_0", "q4_0"] + sorted(k for k in kp if k.startswith("turbo"))
print("| KV | bits/element | KV bytes/token | kiln ppl | kiln vs f16 | llama.cpp ppl | llama.cpp vs f16 |")
print("|---|---|---|---|---|---|---|")
f32b = fl(kb, "f32")
ok = True
for k in order:
    a, b = fl(kp, k), fl(lp, k)
    ra = (a / fl(kp, "f16") - 1) if a and fl(kp, "f16") else None
    rb = (b / fl(lp, "f16") - 1) if b and fl(lp, "f16") else None
    cell = lambda v, r: ("%.4f" % v if v else "-", "%+.3f%%" % (100 * r) if r is not None else "-")
    ca, cb = cell(a, ra), cell(b, rb)
    b = fl(kb, k)
    bits = "%.3f" % (32 * b / f32b) if b and f32b else "-"
    print("| %s | %s | %s | %s | %s | %s | %s |" % (k, bits, "%d" % b if b else "-", ca[0], ca[1], cb[0], cb[1]))
    if k in ("q8_0", "q4_0") and ra is not None and rb is not None and ra > rb + 1e-12:
        ok = False
        print("  kiln's %s change %+.4f%% is worse than llama.cpp's %+.4f%%" % (k, 100 * ra, 100 * rb))
print("ctx %s, text %s; llama.cpp with -fa for f16/q8_0/q4_0 (without for f32), --no-escape" % (sys.argv[1], sys.argv[2]))
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
