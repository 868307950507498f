#!/usr/bin/env python3
"""A/B two kiln builds on the same machine, in the same run, in alternating order.

Usage:
  python3 bench/ab_builds.py --a BUILD_A --b BUILD_B -m MODEL.gguf [-m ...] [--rounds 3]
                             [--reps 3] [-t 2] [--batched] [--engine]

For every model, each round runs build A's then build B's bench/kiln_pp_tg (the order flips
every round, so neither side always gets the warmer or the cooler minute):
  pp512 and tg128 (-p 512 -n 128 -r REPS), and with --batched the 1- and 16-sequence batched
  decode (--what batched --batched 1,16 --batch-prompt 128 --batch-gen 32);
with --engine also `kiln bench --concurrency 1,16 --prompt-tokens 128 --gen-tokens 32 --json`
(the engine end to end: scheduler, runner, sampling).
It prints, per row, the median tok/s of A and of B over rounds x reps samples and the median
of the per-round ratios B/A (both sides of a ratio ran in the same round). A ratio above 1
means B is faster.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_pp_tg(build, model, threads, reps, what, extra):
    cmd = [os.path.join(build, "bench", "kiln_pp_tg"), "-m", model, "-t", str(threads),
           "-r", str(reps), "--what", what] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        o = json.loads(line)
        key = o["test"]
        if "sequences" in o:
            key = "%s%s" % (key, o["sequences"])
        rows[key] = o["tps"]
    return rows


def run_engine(build, model, threads):
    cmd = [os.path.join(build, "kiln"), "bench", "-m", model, "-t", str(threads),
           "--concurrency", "1,16", "--prompt-tokens", "128", "--gen-tokens", "32", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    o = json.loads(out)
    rows = {}
    for lv in o["levels"]:
        c = lv["concurrency"]
        rows["engine_gen_c%s" % c] = [lv["total_gen_tok_s"]]
        rows["engine_prefill_c%s" % c] = [lv["prefill_tok_s"]]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--batched", action="store_true")
    ap.add_argument("--engine", action="store_true")
    args = ap.parse_args()
    for model in args.model:
        samples = {"a": {}, "b": {}}
        ratios = {}
        for r in range(args.rounds):
            order = ["a", "b"] if r % 2 == 0 else ["b", "a"]
            got = {}
            for side in order:
                build = args.a if side == "a" else args.b
                rows = run_pp_tg(build, model, args.threads, args.reps, "pp,tg",
                                 ["-p", "512", "-n", "128"])
                if args.batched:
                    rows.update(run_pp_tg(build, model, args.threads, args.reps, "batched",
                                          ["--batched", "1,16", "--batch-prompt", "128",
                                           "--batch-gen", "32"]))
                if args.engine:
                    rows.update(run_engine(build, model, args.threads))
                got[side] = rows
                for k, v in rows.items():
                    samples[side].setdefault(k, []).extend(v)
            for k in got["a"]:
                if k in got["b"]:
                    ratios.setdefault(k, []).append(
                        statistics.median(got["b"][k]) / statistics.median(got["a"][k]))
        print("model %s (%d rounds x %d reps, %d threads)" %
              (os.path.basename(model), args.rounds, args.reps, args.threads))
        print("%-22s %12s %12s %10s  %s" % ("test", "A t/s", "B t/s", "B/A", "per-round B/A"))
        for k in sorted(ratios):
            print("%-22s %12.2f %12.2f %9.3fx  %s" %
                  (k, statistics.median(samples["a"][k]), statistics.median(samples["b"][k]),
                   statistics.median(ratios[k]), " ".join("%.3f" % x for x in ratios[k])))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
