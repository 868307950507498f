#!/usr/bin/env bash
# Speculative decoding's speed goals (issue 18), all in one run, CPU, 2 threads, on a
# tinyllama-1.1b-shaped model from `kiln gen-model --preset tinyllama-1.1b --seed 1` (random
# weights): Q4_0 (gen-model --type q4_0) for the prediction, random and n-gram goals; F16
# (gen-model --type f16) as the target of the draft-model goal, with `kiln quantize`'s Q4_0 of
# that very F16 file as the draft (gen-model's own q4_0 is quantized from the generator's f32
# values, not from the f16 ones, and differs in ~3% of its bytes, so it is not "its copy").
# Each `kiln bench --spec` runs its plain and speculative phases interleaved request by request
# in one process (3 requests of 128 greedy tokens, 128-token synthetic prompts unless said):
#   1. prediction:self (the prediction is the request's own plain output) >= 3x plain decode;
#   2. prediction:edit=10 (10% of that output's tokens replaced) >= 1.8x;
#   3. random drafts cost <= 10% (ratio >= 0.9: adaptive k backs off; 5 requests);
#   4. n-gram on a "repeat this document with small changes" prompt >= 2x
#      (bench/spec/repeat_document.txt; a random-weight model does not follow it: reported as
#      measured);
#   5. the F16 target with its Q4_0 copy as the draft >= 1.5x the F16 target alone;
#   6. pycode10M (a real model trained on Python): n-gram and prediction acceptance continuing
#      held-out files of its valid.txt, and on a copy task (bench/spec/pycode_accept.py), and
#      its Q4_0 GGUF copy's acceptance as a draft; no goal.
# 1 and 2 are also run at --spec-k 32 (default 8). The verify-scaling tables (forward cost of
# M tokens against 1, Q4_0 and F16) say what a verify of k + 1 tokens costs on this CPU, which
# caps the speedups: prediction:self at k drafts gives about (k + 1) / ratio(k + 1); the
# report prints such estimates beside the goals.
# Every speculative output must equal its plain output token for token; a MISMATCH fails.
# usage: bench/spec/run.sh [BUILD_DIR] [WORK_DIR]   (about 10 minutes on 2 cores)
set -euo pipefail
build=${1:-build}
work=${2:-/tmp/kiln-bench-spec}
kiln="$build/kiln"
here=$(cd "$(dirname "$0")" && pwd)
shared=${KILN_SHARED_DIR:-$here/../../../shared}
mkdir -p "$work"
q4="$work/tinyllama-q4_0.gguf"
f16="$work/tinyllama-f16.gguf"
f16q4="$work/tinyllama-f16-q4_0.gguf"
[ -f "$q4" ] || "$kiln" gen-model --preset tinyllama-1.1b --type q4_0 --seed 1 -o "$q4" -t 2
[ -f "$f16" ] || "$kiln" gen-model --preset tinyllama-1.1b --type f16 --seed 1 -o "$f16" -t 2
[ -f "$f16q4" ] || "$kiln" quantize "$f16" "$f16q4" --type q4_0 -t 2
pycode="$shared/models/pycode10M"
pyq4="$work/pycode10M-q4_0.gguf"
if [ -d "$pycode" ] && [ ! -f "$pyq4" ]; then
    "$kiln" convert "$pycode" "$work/pycode10M-f32.gguf" --type f32 2>/dev/null
    "$kiln" quantize "$work/pycode10M-f32.gguf" "$pyq4" --type q4_0
fi
grep -c avx512f /proc/cpuinfo > "$work/avx512_cores.txt" || true
uptime > "$work/load.txt"

common=(-t 2 --requests 3 --gen-tokens 128 --json)
b() { # b NAME ARGS...: one kiln bench --spec run into $work/NAME.json (rc in NAME.rc)
    local name=$1
    shift
    local rc=0
    "$kiln" bench "$@" > "$work/$name.json" || rc=$?
    echo "$rc" > "$work/$name.rc"
}
b self -m "$q4" "${common[@]}" --spec prediction:self
b edit10 -m "$q4" "${common[@]}" --spec prediction:edit=10
b random -m "$q4" "${common[@]}" --spec random --requests 5 # borderline: more pairs
b ngram -m "$q4" "${common[@]}" --spec ngram --prompt-file "$here/repeat_document.txt"
b self_k32 -m "$q4" "${common[@]}" --spec prediction:self --spec-k 32
b edit10_k32 -m "$q4" "${common[@]}" --spec prediction:edit=10 --spec-k 32
b draft -m "$f16" "${common[@]}" --spec "draft:$f16q4"
b scaling_q4 -m "$q4" -t 2 --verify-scaling --gen-tokens 64 --json
b scaling_f16 -m "$f16" -t 2 --verify-scaling --gen-tokens 64 --json
uptime >> "$work/load.txt"

# why the draft is rejected: F16 and its Q4_0 copy teacher-forced on the F16's greedy output
"$kiln" run -m "$f16" -t 2 --temp 0 -n 48 --json -p "The water supply to the north gate" \
    > "$work/draft_ids.json"
ids=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(','.join(map(str, d['prompt_ids'] + d['generated_ids'])))" "$work/draft_ids.json")
"$kiln" logits -m "$f16" -t 2 --ids "$ids" -o "$work/logits_f16.safetensors" > /dev/null
"$kiln" logits -m "$f16q4" -t 2 --ids "$ids" -o "$work/logits_q4.safetensors" > /dev/null

if [ -d "$pycode" ]; then
    python3 "$here/pycode_accept.py" --kiln "$kiln" --model "$pycode" \
        --valid "$pycode/valid.txt" --work "$work/pycode" -t 2 > "$work/pycode.json"
    b pycode_draft -m "$pycode" "${common[@]}" --spec "draft:$pyq4" \
        --prompt-file "$pycode/valid.txt" --prompt-tokens 256 --requests 6
fi

python3 - "$work" <<'PY'
import array, json, os, statistics, sys
work = sys.argv[1]
def load(name):
    p = os.path.join(work, name + ".json")
    rc = int(open(os.path.join(work, name + ".rc")).read())
    return json.load(open(p)) if os.path.getsize(p) else None, rc
bad = []
def level(name):
    d, rc = load(name)
    if d is None:
        sys.exit(f"{name}: kiln bench failed (exit {rc})")
    lv = d["levels"][0]
    if not lv["outputs_match"] or rc:
        bad.append(name)
    return d, lv
def line(name, lv):
    p, s = lv["plain"], lv["spec"]
    return (f"{name:16s} plain {p['decode_tok_s_median']:7.2f} tok/s [{p['decode_tok_s_min']:.2f}, {p['decode_tok_s_max']:.2f}]"
            f"  spec {s['decode_tok_s_median']:7.2f} [{s['decode_tok_s_min']:.2f}, {s['decode_tok_s_max']:.2f}]"
            f"  ratio {lv['ratio']:5.2f} (pairwise {lv['pair_ratio_median']:.2f})  accept {100*s['acceptance']:5.1f}% ({s['accepted_tokens']}/{s['drafted_tokens']})"
            f"  {s['verify_steps']} verify steps, {s['tokens_per_verify_step']:.2f} tok/step"
            f"  pred acc/rej {s['accepted_prediction_tokens']}/{s['rejected_prediction_tokens']}"
            f"  wall {p['wall_s']:.1f}/{s['wall_s']:.1f} s  outputs {'match' if lv['outputs_match'] else 'MISMATCH'}")
print("load (uptime) before / after:", " | ".join(l.strip().split("load average:")[-1] for l in open(os.path.join(work, "load.txt"))))
print("AVX-512 cores:", open(os.path.join(work, "avx512_cores.txt")).read().strip())
runs = {}
for name in ("self", "edit10", "random", "ngram", "self_k32", "edit10_k32", "draft"):
    d, lv = level(name)
    runs[name] = lv
    print(line(name, lv), f"  (spec-k {d['spec_k']}, prompt {d['prompt_tokens']})")
def scaling(name):
    d, rc = load(name)
    if d is None or rc:
        bad.append(name)
    if d is None:
        return {}
    print(f"verify scaling, {name[8:]} (median of 5; prefill = TTFT of an M-token prompt; verify = ms per"
          " forward verifying M - 1 accepted drafts):")
    print(f"{'M':>4} {'prefill ms':>11} {'ratio':>6} {'verify ms':>10} {'ratio':>6} {'tok/fwd':>8}")
    for r in d["verify_scaling"]:
        print(f"{r['m']:4d} {r['prefill_ttft_ms']:11.1f} {r['prefill_ratio']:6.2f} {r['verify_forward_ms']:10.1f}"
              f" {r['verify_ratio']:6.2f} {r['tokens_per_forward']:8.2f}")
    return {r["m"]: r for r in d["verify_scaling"]}
sq4 = scaling("scaling_q4")
sf16 = scaling("scaling_f16")

# teacher-forced agreement of the draft (F16's Q4_0 copy) with the F16 target
def st_logits(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
        base = 8 + n
        t = hdr["logits"]
        a, b = t["data_offsets"]
        f.seek(base + a)
        v = array.array("f")
        v.frombytes(f.read(b - a))
        return v, t["shape"]
lf, (T, V) = st_logits(os.path.join(work, "logits_f16.safetensors"))
lq, _ = st_logits(os.path.join(work, "logits_q4.safetensors"))
agree, gaps, diffs = 0, [], []
for t in range(T):
    rf, rq = lf[t * V:(t + 1) * V], lq[t * V:(t + 1) * V]
    af = max(range(V), key=rf.__getitem__)
    aq = max(range(V), key=rq.__getitem__)
    agree += af == aq
    top = sorted(rf, reverse=True)[:2]
    gaps.append(top[0] - top[1])
    diffs.append(abs(rf[af] - rq[af]))
print(f"draft vs target, teacher-forced over {T} positions: argmax agreement {100*agree/T:.1f}%"
      f" | F16 top-1 - top-2 logit gap median {statistics.median(gaps):.4f}"
      f" | |F16 - Q4_0| at the F16 top-1 median {statistics.median(diffs):.4f}")

# What the verify costs allow, roughly (a fixed k; the engine adapts k, so these are estimates,
# not bounds; verify ratio r(M) from the tables at M = k + 1):
#   prediction with a fraction p of tokens edited at random: a step emits on average
#   (1 - (1 - p)^(k + 1)) / p tokens (accept until the first edit, which the sampled token
#   corrects) for the cost r(k + 1); a draft model accepted with probability a per token:
#   (1 - a^(k + 1)) / (1 - a) tokens for k draft steps (each d = its decode ms / the
#   target's) plus r(k + 1). Best k of 1, 4, 8, 16, 32.
def best(tab, tokens, extra_cost=lambda k: 0.0):
    out = []
    for m in sorted(tab):
        k = m - 1
        if k < 1 or tab[m]["verify_ratio"] <= 0:
            continue
        out.append((tokens(k) / (extra_cost(k) + tab[m]["verify_ratio"]), k))
    return max(out) if out else (0.0, 0)
def goal(text, ratio, want, extra=""):
    ok = ratio >= want
    print(f"{text}: {ratio:.2f}x (goal >= {want}x): {'ok' if ok else 'MISSED'}{extra}")
def cap(k):  # (k + 1) / verify cost ratio at M = k + 1, interpolated from the table
    ms = sorted(sq4)
    m = k + 1
    lo = max([x for x in ms if x <= m]); hi = min([x for x in ms if x >= m])
    rl, rh = sq4[lo]["verify_ratio"], sq4[hi]["verify_ratio"]
    r = rl if hi == lo else rl + (rh - rl) * (m - lo) / (hi - lo)
    return m / r if r > 0 else 0
print()
goal("prediction:self, spec-k 8", runs["self"]["ratio"], 3.0,
     f" | verify-cost estimate (k+1)/ratio(k+1) at k 8: {cap(8):.2f}x" if sq4 else "")
goal("prediction:self, spec-k 32", runs["self_k32"]["ratio"], 3.0,
     f" | estimate at k 32: {cap(32):.2f}x" if sq4 else "")
eb = best(sq4, lambda k: (1 - 0.9 ** (k + 1)) / 0.1) if sq4 else (0, 0)
goal("prediction:edit=10, spec-k 8", runs["edit10"]["ratio"], 1.8,
     f" | verify-cost estimate at the best fixed k ({eb[1]}): {eb[0]:.2f}x" if sq4 else "")
goal("prediction:edit=10, spec-k 32", runs["edit10_k32"]["ratio"], 1.8)
goal("random drafts (cost <= 10%)", runs["random"]["ratio"], 0.9)
ng = runs["ngram"]["spec"]
goal("n-gram, repeat-the-document prompt", runs["ngram"]["ratio"], 2.0,
     f" | acceptance {100*ng['acceptance']:.1f}% of {ng['drafted_tokens']} drafts: a random-weight model"
     " does not copy its prompt, so prompt lookup finds little to draft")
dr = runs["draft"]["spec"]
extra = f" | acceptance {100*dr['acceptance']:.1f}% (teacher-forced argmax agreement {100*agree/T:.1f}%)"
if sq4 and sf16:
    d = sq4[1]["verify_forward_ms"] / sf16[1]["verify_forward_ms"]  # a Q4_0 draft step / an F16 step
    for a in (agree / T, 0.8, 0.9):
        sp, k = best(sf16, lambda k: (1 - a ** (k + 1)) / (1 - a), lambda k: k * d)
        extra += f" | estimate at acceptance {a:.2f}: {sp:.2f}x (best k {k})"
    extra += f" [draft step = {d:.2f} target steps]"
goal("F16 target + its Q4_0 copy as draft", runs["draft"]["ratio"], 1.5, extra)
pj = os.path.join(work, "pycode.json")
if os.path.exists(pj):
    p = json.load(open(pj))
    if not p["outputs_match"]:
        bad.append("pycode")
    for task in ("continue", "repeat"):
        t = p["total"][task]
        print(f"pycode10M {task:8s} ({len(p['files'])} files of valid.txt, {p['gen_tokens']} greedy tokens each):"
              f" n-gram acceptance {100*t['ngram']['acceptance']:.1f}% ({t['ngram']['accepted']}/{t['ngram']['drafted']})"
              f" | prediction = real continuation, {p['edits_per_file']} lines edited: acceptance"
              f" {100*t['edited']['acceptance']:.1f}% ({t['edited']['accepted']}/{t['edited']['drafted']}),"
              f" prediction tokens accepted/rejected {t['edited']['accepted_prediction_tokens']}/{t['edited']['rejected_prediction_tokens']}"
              f" | unedited: {100*t['real']['acceptance']:.1f}%")
    d, lv = level("pycode_draft")
    s = lv["spec"]
    print(f"pycode10M + its Q4_0 GGUF as draft (256-token prompts from valid.txt): acceptance"
          f" {100*s['acceptance']:.1f}% ({s['accepted_tokens']}/{s['drafted_tokens']}), ratio {lv['ratio']:.2f}x"
          " (a 10M target is no slower than its draft: the ratio means nothing here)")
if bad:
    print("MISMATCH or failure in:", ", ".join(bad))
    sys.exit(1)
print("every speculative output equals its plain output")
PY
