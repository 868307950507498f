#!/usr/bin/env python3
"""kiln vs llama.cpp on the CPU, same GGUF, same machine, same thread count.

Protocol: README.md in this directory. Python 3 standard library only.

  python3 bench/cpu_vs_llamacpp/run.py --kiln-build build [--llama-cpp-dir DIR]
      [--isa native|avx2|avx2-vnni] [--threads N] [--rounds 3] [--reps 3] [--types f16,q8_0,q4_0] [--cache DIR]
      [--batched 1,4,8,16] [--batch-gen 32] [--engine] [--json OUT.json]

LLAMA_CPP_DIR (or --llama-cpp-dir) names a llama.cpp build: its bin/llama-bench (or
llama-bench directly inside it) is used. Without it kiln runs alone.

--isa avx2 runs kiln (kiln_pp_tg, cpu_peaks, kiln bench) with KILN_SIMD=avx2 KILN_VNNI=0 (the
AVX2 path with vpmaddubsw, as on Zen 2/3) and takes llama.cpp from LLAMA_CPP_AVX2_DIR (an
AVX2-only build: GGML_NATIVE=OFF GGML_AVX2=ON GGML_AVX512=OFF GGML_AVX_VNNI=OFF) unless
--llama-cpp-dir names one; --isa avx2-vnni likewise with AVX-VNNI allowed (KILN_SIMD=avx2
only; pair it with a llama.cpp built with GGML_AVX_VNNI=ON). --isa native (the default) sets
nothing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def physical_cores():
    """Distinct (package, core) pairs among the CPUs this process may run on."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:
        allowed = set(range(os.cpu_count() or 1))
    pairs = set()
    for cpu in allowed:
        base = "/sys/devices/system/cpu/cpu%d/topology/" % cpu
        try:
            with open(base + "core_id") as f:
                core = f.read().strip()
            with open(base + "physical_package_id") as f:
                pkg = f.read().strip()
        except OSError:
            continue
        pairs.add((pkg, core))
    return len(pairs) or len(allowed) or 1


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def roofline(peaks, threads, what="all"):
    """bench/cpu_peaks' medians as {"fma_gflops", "int8_gmacs", "bw_gbs"} (the lines it could
    measure), or {} without it. The probe is optional: a failure only loses its figures."""
    if not peaks:
        return {}
    try:
        p = subprocess.run([peaks, str(threads), "1024", what], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        sys.stderr.write("cpu_peaks failed (%s); continuing without it\n" % e)
        return {}
    if p.returncode != 0:
        sys.stderr.write("cpu_peaks failed (%d): %s" % (p.returncode, p.stderr[-500:]))
        return {}
    out = {}
    keys = {"f32 FMA": "fma_gflops", "int8 MAC": "int8_gmacs", "read bandwidth": "bw_gbs"}
    for line in p.stdout.splitlines():
        for key, name in keys.items():
            if not line.startswith(key):
                continue
            # "<name> [(<what>)]  <median> <unit>  (min ..., max ...)"; else it says why not
            words = line[len(key):].split()
            for i in range(1, len(words)):
                if words[i] in ("GFLOP/s", "GMAC/s", "GB/s"):
                    try:
                        out[name] = float(words[i - 1])
                    except ValueError:
                        pass
                    break
    return out


def bandwidth(peaks, threads):
    """Median read bandwidth (GB/s) measured by bench/cpu_peaks just now, or None."""
    return roofline(peaks, threads, "bandwidth").get("bw_gbs")


# environment of every child per --isa (only kiln reads it; llama.cpp's ISA is its build's)
ISA_ENV = {"native": {}, "avx2": {"KILN_SIMD": "avx2", "KILN_VNNI": "0"},
           "avx2-vnni": {"KILN_SIMD": "avx2"}}


def run(cmd, timeout=3600):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write("command failed (%d): %s\n%s\n" % (p.returncode, " ".join(cmd),
                                                            p.stderr[-2000:]))
        raise SystemExit(1)
    return p.stdout


def find_exe(build, names):
    for n in names:
        for cand in (os.path.join(build, n), os.path.join(build, "bin", n),
                     os.path.join(build, "bench", n)):
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
    return None


def gen_models(kiln, cache, types, seed):
    os.makedirs(cache, exist_ok=True)
    paths = {}
    for t in types:
        path = os.path.join(cache, "tinyllama-1.1b-%s-seed%d.gguf" % (t, seed))
        if not os.path.isfile(path):
            tmp = path + ".tmp"
            print("generating %s ..." % path, flush=True)
            run([kiln, "gen-model", "--arch", "llama", "--preset", "tinyllama-1.1b", "--type", t,
                 "--seed", str(seed), "-o", tmp])
            os.replace(tmp, path)
        paths[t] = path
    return paths


def llama_bench(exe, model, threads, reps, p, n):
    cmd = [exe, "-m", model, "-p", str(p), "-n", str(n), "-t", str(threads), "-r", str(reps),
           "-o", "json"]
    out = json.loads(run(cmd))
    res = {}
    for row in out:
        if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
            res["pp%d" % row["n_prompt"]] = list(row["samples_ts"])
        elif row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0:
            res["tg%d" % row["n_gen"]] = list(row["samples_ts"])
    return res, cmd


def kiln_pp_tg(exe, model, threads, reps, p, n, extra=()):
    cmd = [exe, "-m", model, "-t", str(threads), "-r", str(reps), "-p", str(p), "-n", str(n)]
    cmd += list(extra)
    res = {}
    for line in run(cmd).splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        key = row["test"]
        if key == "batched":
            key = "batched%d" % row["sequences"]
        res[key] = list(row["tps"])
    return res, cmd


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs):
    """(max - min) / median, in percent: how noisy the samples were."""
    if len(xs) < 2:
        return 0.0
    m = med(xs)
    return 100.0 * (max(xs) - min(xs)) / m if m else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln-build", default="build", help="kiln build directory")
    ap.add_argument("--llama-cpp-dir", default=None,
                    help="llama.cpp build directory (default: $LLAMA_CPP_DIR, with --isa avx2* "
                         "$LLAMA_CPP_AVX2_DIR; none: kiln alone)")
    ap.add_argument("--isa", choices=sorted(ISA_ENV), default="native",
                    help="kiln's SIMD path: native, avx2 (KILN_SIMD=avx2 KILN_VNNI=0) or "
                         "avx2-vnni (KILN_SIMD=avx2)")
    ap.add_argument("--threads", type=int, default=0, help="threads (default: physical cores)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of llama.cpp / kiln")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per run (llama-bench -r)")
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cache", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                    "kiln-bench-models"))
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--batched", default="1,4,8,16", help="concurrent sequences ('' = skip)")
    ap.add_argument("--batch-prompt", type=int, default=128)
    ap.add_argument("--batch-gen", type=int, default=32, help="decode steps timed per level")
    ap.add_argument("--batched-types", default="q4_0", help="models for the batched rows")
    ap.add_argument("--engine", action="store_true",
                    help="also run `kiln bench` (the engine, continuous batching)")
    ap.add_argument("--json", help="write every sample and the command lines here")
    a = ap.parse_args()
    if a.llama_cpp_dir is None:
        a.llama_cpp_dir = os.environ.get("LLAMA_CPP_DIR" if a.isa == "native"
                                         else "LLAMA_CPP_AVX2_DIR")
    for k in ("KILN_SIMD", "KILN_VNNI"):  # the chosen ISA alone decides
        os.environ.pop(k, None)
    os.environ.update(ISA_ENV[a.isa])

    kiln = find_exe(a.kiln_build, ["kiln"])
    pptg = find_exe(a.kiln_build, ["kiln_pp_tg"])
    peaks = find_exe(a.kiln_build, ["cpu_peaks"])  # optional: the roofline columns
    if not kiln or not pptg:
        sys.exit("kiln and bench/kiln_pp_tg not found in %s (build targets kiln kiln_pp_tg)"
                 % a.kiln_build)
    lb = None
    if a.llama_cpp_dir:
        lb = find_exe(a.llama_cpp_dir, ["llama-bench"])
        if not lb:
            sys.exit("no llama-bench under %s" % a.llama_cpp_dir)
    threads = a.threads or physical_cores()
    types = [t for t in a.types.split(",") if t]
    models = gen_models(kiln, a.cache, types, a.seed)
    pp, tg = "pp%d" % a.n_prompt, "tg%d" % a.n_gen

    report = {"isa": a.isa, "kiln_env": ISA_ENV[a.isa], "threads": threads, "rounds": a.rounds, "reps": a.reps, "rows": [],
              "batched": [], "engine": [], "load": [], "roofline": []}
    if lb:
        try:
            info = json.loads(run([lb, "-m", models[types[0]], "-p", "1", "-n", "0", "-r", "1",
                                   "-t", str(threads), "-o", "json"]))
            report["llama_cpp_commit"] = info[0].get("build_commit")
        except SystemExit:
            report["llama_cpp_commit"] = None
    print("isa %s (kiln env %s), threads %d, %d rounds x %d reps, load average %.2f at start" %
          (a.isa, " ".join("%s=%s" % kv for kv in ISA_ENV[a.isa].items()) or "-", threads,
           a.rounds, a.reps, loadavg()), flush=True)
    report["roofline"].append(roofline(peaks, threads))

    for t in types:
        m = models[t]
        samples = {("llama.cpp", pp): [], ("llama.cpp", tg): [], ("kiln", pp): [],
                   ("kiln", tg): []}
        bw = {"llama.cpp": [], "kiln": []}  # read bandwidth just before each run
        cmds = {}
        for r in range(a.rounds):
            # alternate which engine goes first, so that drifts in machine load hit both
            order = ["llama.cpp", "kiln"] if r % 2 == 0 else ["kiln", "llama.cpp"]
            for eng in order:
                if eng == "llama.cpp" and not lb:
                    continue
                report["load"].append(loadavg())
                bw[eng].append(bandwidth(peaks, threads))
                if eng == "llama.cpp":
                    res, cmd = llama_bench(lb, m, threads, a.reps, a.n_prompt, a.n_gen)
                else:
                    res, cmd = kiln_pp_tg(pptg, m, threads, a.reps, a.n_prompt, a.n_gen)
                cmds[eng] = " ".join(cmd)
                for test in (pp, tg):
                    samples[(eng, test)] += res.get(test, [])
            print("  %s round %d/%d done (load %.2f)" % (t, r + 1, a.rounds, loadavg()),
                  flush=True)
        for test in (pp, tg):
            k, l = samples[("kiln", test)], samples[("llama.cpp", test)]
            report["rows"].append({
                "type": t, "test": test, "kiln": k, "llama_cpp": l,
                "kiln_median": med(k), "llama_cpp_median": med(l) if l else None,
                "ratio": med(k) / med(l) if l else None,
                "bw_kiln": bw["kiln"], "bw_llama_cpp": bw["llama.cpp"],
                "kiln_cmd": cmds.get("kiln"), "llama_cpp_cmd": cmds.get("llama.cpp")})

    levels = [x for x in a.batched.split(",") if x]
    for t in [x for x in a.batched_types.split(",") if x]:
        if not levels or t not in models:
            continue
        # as many samples per level as the pp/tg cells have (rounds x reps), interleaved
        bw_before = bandwidth(peaks, threads)
        res, cmd = kiln_pp_tg(pptg, models[t], threads, a.rounds * a.reps, a.n_prompt, a.n_gen,
                              ["--what", "batched", "--batched", ",".join(levels),
                               "--batch-prompt", str(a.batch_prompt), "--batch-gen",
                               str(a.batch_gen)])
        bw_after = bandwidth(peaks, threads)
        base = res.get("batched%s" % levels[0], [])
        for lv in levels:
            s = res.get("batched%s" % lv, [])
            # kiln_pp_tg interleaves the levels' repetitions, so repetition r of every level
            # ran in the same minute: the multiple is the median of the per-repetition ratios
            # (memory bandwidth here drifts by tens of percent between minutes)
            ratios = [x / b for x, b in zip(s, base) if b > 0]
            report["batched"].append({"type": t, "sequences": int(lv), "tps": s,
                                      "median": med(s), "x_single_per_rep": ratios,
                                      "x_single": med(ratios) if ratios else float("nan"),
                                      "x_single_of_medians": med(s) / med(base),
                                      "bw_before": bw_before, "bw_after": bw_after,
                                      "cmd": " ".join(cmd)})
        if a.engine:
            cmd = [kiln, "bench", "-m", models[t], "--concurrency", ",".join(levels),
                   "--prompt-tokens", str(a.batch_prompt), "--gen-tokens", str(a.n_gen), "-t",
                   str(threads), "--json"]
            out = run(cmd)
            try:
                report["engine"].append({"type": t, "cmd": " ".join(cmd),
                                         "result": json.loads(out)})
            except ValueError:
                report["engine"].append({"type": t, "cmd": " ".join(cmd), "raw": out})

    report["roofline"].append(roofline(peaks, threads))

    # ---- report
    print()
    if lb:
        print("llama.cpp: %s (commit %s)" % (lb, report.get("llama_cpp_commit")))
    print("isa: %s; threads: %d; medians over %d rounds x %d reps; spread = (max - min) / median"
          % (a.isa, threads, a.rounds, a.reps))
    print()
    for when, r in zip(("start", "end"), report["roofline"]):
        if r:
            print("roofline at the %s (bench/cpu_peaks, %d threads): f32 FMA %s GFLOP/s, int8 "
                  "MAC %s GMAC/s, read bandwidth %s GB/s" % (
                      when, threads, r.get("fma_gflops", "-"), r.get("int8_gmacs", "-"),
                      r.get("bw_gbs", "-")))
    print()
    print("| model | test | kiln t/s | spread | llama.cpp t/s | spread | kiln / llama.cpp "
          "| read GB/s before kiln / llama.cpp runs |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for row in report["rows"]:
        l = row["llama_cpp"]
        gbs = lambda xs: " ".join("-" if b is None else "%.0f" % b for b in xs) or "-"
        print("| tinyllama-1.1b %s | %s | %.2f | %.0f%% | %s | %s | %s | %s / %s |" % (
            row["type"].upper(), row["test"], row["kiln_median"], spread(row["kiln"]),
            "%.2f" % row["llama_cpp_median"] if l else "-", "%.0f%%" % spread(l) if l else "-",
            "%.2fx" % row["ratio"] if l else "-", gbs(row["bw_kiln"]),
            gbs(row["bw_llama_cpp"])))
    if report["batched"]:
        print()
        print("kiln batched decode (forward pass, %d-token prompts, %d steps timed):" %
              (a.batch_prompt, a.batch_gen))
        print()
        print("| model | sequences | aggregate t/s | spread | x single sequence "
              "(median of per-rep ratios) | per-rep ratios | ratio of medians |")
        print("|---|---:|---:|---:|---:|---|---:|")
        for b in report["batched"]:
            print("| tinyllama-1.1b %s | %d | %.2f | %.0f%% | %.2fx | %s | %.2fx |" % (
                b["type"].upper(), b["sequences"], b["median"], spread(b["tps"]),
                b["x_single"], " ".join("%.2f" % r for r in b["x_single_per_rep"]),
                b["x_single_of_medians"]))
        print()
        for b in report["batched"]:
            if b["sequences"] == int(levels[0]):  # one line per model (same for every level)
                print("read bandwidth before / after the %s batched runs: %s / %s GB/s" % (
                    b["type"].upper(), *("-" if v is None else "%.1f" % v
                                         for v in (b["bw_before"], b["bw_after"]))))
    for e in report["engine"]:
        print()
        print("kiln bench (engine), %s: %s" % (e["type"], e["cmd"]))
        print(json.dumps(e.get("result", e.get("raw")), indent=1)[:4000])
    loads = [x for x in report["load"] if x == x]
    if loads:
        print()
        print("load average before runs: min %.2f, median %.2f, max %.2f" %
              (min(loads), med(loads), max(loads)))
    print("commands:")
    seen = set()
    for row in report["rows"]:
        for c in (row["kiln_cmd"], row["llama_cpp_cmd"]):
            if c and c not in seen:
                seen.add(c)
                print("  " + c)
    for b in report["batched"][:1]:
        print("  " + b["cmd"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
