#!/usr/bin/env python3
"""Bit-exact goldens of kiln's logits and greedy tokens (see README.md beside this file).

    golden.py make  --kiln KILN --decode GOLDEN_DECODE --shared SHARED -o goldens.txt
    golden.py check --kiln KILN --decode GOLDEN_DECODE --shared SHARED -g goldens.txt [--quick]

`make` runs every case of the matrix below with the given binaries (those of the commit that
the goldens pin) and writes the goldens file; it needs every SIMD path. `check` runs the same
cases with the binaries under test and compares: the SHA-256 of the logits tensor's bytes of
`kiln logits`, the SHA-256 of golden_decode's output (greedy tokens with the bits of their
logprobs and top-20 alternatives, through the public API) and the generated ids of
`kiln run --temp 0 --json`. It prints each difference with its case and exits 1 on any,
77 when the reference data is absent.

A case is named "KIND MODEL SIMD KV tTHREADS VARIANT" (the first six words of its golden
line). Model files made at test time (kiln quantize / kiln convert) are pinned by their
SHA-256 ("file" lines) before any case runs.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
SIMD_PATHS = ["scalar", "avx2", "avx512"]
KV_TYPES = ["f32", "f16"]
HASH_HEX = 32  # case results keep 128 bits of their SHA-256 (model files: all 256)
N_GEN = 24  # generated tokens per decode / run case
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the park with her friends. One day, she found a big red ball under a tree and ran to "
        "show her mom.")
N_TEXT_IDS = 45  # logits over 45 tokens: past the >= 32-token batched kernels, with a tail
N_TEXT_PROMPT = 13  # decode prompt: the first 13 of them (prefill below 32 tokens)
RUN_PROMPT = "Once upon a time, there was a little girl"
PY_RUN_PROMPT = "def fibonacci(n):\n    "
N_PY_MADE_IDS = 77  # logits of the GGUF files made from pycode10M: its first 77 ids

HF = "reference/hf/"
M = "models/"

# Models. "src": a path under the shared dir, or "@key" of a file made from "make" (a kiln
# command over shared files; "OUT" is the made file). "ids": where the token ids come from:
# "ref" = the reference.safetensors of the directory (input_ids / prompt_ids), "text" = TEXT
# tokenized by the model's tokenizer (with BOS), "@key" = those of another model.
# "run": the prompt of a `kiln run` case (models with a tokenizer).
MODELS = [
    *[{"key": "hf-" + a, "src": HF + a, "ids": "ref"} for a in [
        "llama", "llama3", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mixtral",
        "qwen3_moe", "qwen3_next", "gpt2"]],
    {"key": "pycode10M", "src": M + "pycode10M", "ids": "ref", "run": PY_RUN_PROMPT},
    {"key": "stories260K-gguf", "src": M + "stories260K/stories260K-f32.gguf", "ids": "text",
     "run": RUN_PROMPT},
    {"key": "stories260K-gguf-v1", "src": M + "stories260K/stories260K-f32-gguf-v1.gguf",
     "ids": "@stories260K-gguf", "run": RUN_PROMPT},
    {"key": "llama2xs-f32", "src": M + "llama2xs-260K/llama2xs-f32.gguf",
     "ids": "@stories260K-gguf", "run": RUN_PROMPT},
    {"key": "llama2xs-Q8_0", "src": M + "llama2xs-260K/llama2xs-Q8_0.gguf",
     "ids": "@stories260K-gguf", "run": RUN_PROMPT, "quant": True},
    {"key": "llama2xs-Q4_0", "src": M + "llama2xs-260K/llama2xs-Q4_0.gguf",
     "ids": "@stories260K-gguf", "run": RUN_PROMPT, "quant": True},
    {"key": "stories260K-bin", "src": M + "stories260K/stories260K.bin",
     "ids": "@stories260K-gguf", "run": RUN_PROMPT},
    {"key": "llama2xs-bin", "src": M + "llama2xs-260K/llama2xs.bin", "ids": "@stories260K-gguf",
     "run": RUN_PROMPT},
    {"key": "aidreams260K-bin", "src": M + "aidreams260K/aidreams260K.bin", "ids": "text",
     "run": RUN_PROMPT},
    {"key": "babyllama-bin", "src": M + "babyllama-tok105/model5000.bin", "ids": "text",
     "run": RUN_PROMPT},
    # packed F16 / BF16 weights: kiln quantize of the f32 GGUFs
    {"key": "llama2xs-f16", "src": "@llama2xs-f16", "ids": "@stories260K-gguf",
     "run": RUN_PROMPT,
     "make": ["quantize", M + "llama2xs-260K/llama2xs-f32.gguf", "OUT", "--type", "f16"]},
    {"key": "llama2xs-bf16", "src": "@llama2xs-bf16", "ids": "@stories260K-gguf",
     "run": RUN_PROMPT,
     "make": ["quantize", M + "llama2xs-260K/llama2xs-f32.gguf", "OUT", "--type", "bf16"]},
    {"key": "stories260K-f16", "src": "@stories260K-f16", "ids": "@stories260K-gguf",
     "run": RUN_PROMPT,  # hidden 172: F16 rows that are not a multiple of 32 or 64
     "make": ["quantize", M + "stories260K/stories260K-f32.gguf", "OUT", "--type", "f16"]},
    # realistic shapes (hidden 256, FFN 768, vocab 8192): kiln convert of pycode10M; the only
    # models whose rows split into the k-quants' 256-blocks
    *[{"key": "pycode10M-" + t, "src": "@pycode10M-" + t, "ids": "@pycode10M",
       "n_ids": N_PY_MADE_IDS, "quant": t != "f16",
       "make": ["convert", M + "pycode10M", "OUT", "--type", t, "--no-tokenizer"]}
      for t in ["f16", "q8_0", "q4_k", "q6_k"]],
]
BY_KEY = {m["key"]: m for m in MODELS}

# Extra axes, each on every SIMD path with the f32 KV cache unless noted.
THREAD_MODELS = ["pycode10M", "pycode10M-q4_k", "llama2xs-Q8_0", "llama2xs-f16", "hf-qwen3_moe",
                 "hf-qwen3_next", "hf-gemma2"]
THREADS = [2, 3]
REPACK_MODELS = ["pycode10M", "pycode10M-f16", "pycode10M-q4_k", "llama2xs-f32", "llama2xs-f16",
                 "llama2xs-bf16", "llama2xs-Q8_0", "llama2xs-Q4_0"]
CHUNK_MODELS = ["pycode10M", "hf-mistral", "hf-gemma2", "hf-gemma3", "hf-qwen3_next",
                "hf-qwen3_moe", "hf-gpt2", "llama2xs-Q8_0", "llama2xs-f16"]
BATCH_MODELS = CHUNK_MODELS
# --quick (sanitizer builds): the default variant of every model, both KV types, every path,
# except that pycode10M's family (the slow models) runs the f16 cache on AVX-512 only
QUICK_SLOW = [m["key"] for m in MODELS if m["key"].startswith("pycode10M")]

ENV_VARIANTS = {
    "-": {},
    "q8act0": {"KILN_Q8_ACT": "0"},  # f32 activations against quantized weights
    "vnni0": {"KILN_VNNI": "0"},  # AVX-512 without VNNI
    "repack0": {"KILN_REPACK": "0"},  # weights left in the file's layout
}


def cpu_paths():
    """The SIMD paths this CPU has (as src/backend/cpu/features.c decides), and a note on the
    rest."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    have = ["scalar"]
    if {"avx2", "fma", "f16c"} <= flags:
        have.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            have.append("avx512")
    return have


def vnni():
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_vnni" in f.read()
    except OSError:
        return False


def st_tensor(path, name):
    """Raw bytes, dtype and shape of one tensor of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        t = header[name]
        a, b = t["data_offsets"]
        f.seek(8 + n + a)
        return f.read(b - a), t["dtype"], t["shape"]


def st_ids(path, name):
    data, dtype, shape = st_tensor(path, name)
    assert dtype == "I32" and len(shape) == 1
    return list(struct.unpack("<%di" % shape[0], data))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Runner:
    def __init__(self, args, tmp):
        self.kiln = args.kiln
        self.decode = args.decode
        self.shared = args.shared
        self.tmp = tmp
        self.keep = args.keep
        self.verbose = args.verbose
        self.force_env = dict(kv.split("=", 1) for kv in args.force_env)
        self.made = {}  # key -> path of the made file

    def path(self, m):
        src = m["src"]
        return self.made[src[1:]] if src.startswith("@") else os.path.join(self.shared, src)

    def cmd(self, argv, env=None, what=""):
        e = dict(os.environ)
        for k in ("KILN_SIMD", "KILN_Q8_ACT", "KILN_VNNI", "KILN_REPACK", "KILN_PK_MIN_TOK",
                  "KILN_GEMV_PF"):
            e.pop(k, None)
        e.update(env or {})
        e.update(self.force_env)
        r = subprocess.run(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if r.returncode != 0:
            raise RuntimeError("%s: exit %d: %s\n  command: %s" % (
                what, r.returncode, r.stderr.decode(errors="replace").strip(), " ".join(argv)))
        return r.stdout

    def make_file(self, m):
        out = os.path.join(self.tmp, m["key"] + ".gguf")
        argv = [self.kiln] + [os.path.join(self.shared, a) if a.startswith(M) else
                              (out if a == "OUT" else a) for a in m["make"]] + ["-t", "1"]
        self.cmd(argv, what="make " + m["key"])
        self.made[m["key"]] = out
        return sha256_file(out)

    def logits(self, m, ids, simd, kv, threads, env, tag):
        out = os.path.join(self.tmp, tag.replace(" ", "_") + ".safetensors")
        self.cmd([self.kiln, "logits", "-m", self.path(m), "--ids", ",".join(map(str, ids)),
                  "-o", out, "-t", str(threads), "--kv-type", kv],
                 dict(ENV_VARIANTS[env], KILN_SIMD=simd), tag)
        data, dtype, shape = st_tensor(out, "logits")
        got_ids = st_ids(out, "input_ids")
        if got_ids != ids or dtype != "F32" or shape[0] != len(ids):
            raise RuntimeError("%s: input_ids/shape of the output are not the input" % tag)
        V = shape[1]
        arg = []
        for p in range(shape[0]):
            row = struct.unpack_from("<%df" % V, data, p * V * 4)
            arg.append(row.index(max(row)))
        if self.keep:
            shutil.copy(out, self.keep)
        os.unlink(out)
        ah = hashlib.sha256(",".join(map(str, arg)).encode()).hexdigest()[:16]
        return "%s argmax:%s" % (hashlib.sha256(data).hexdigest()[:HASH_HEX], ah)

    def decode_case(self, m, prompts, simd, kv, threads, env, chunk, tag):
        argv = [self.decode, "-m", self.path(m), "-n", str(N_GEN), "--kv", kv, "-t",
                str(threads), "--chunk", str(chunk)] + [",".join(map(str, p)) for p in prompts]
        out = self.cmd(argv, dict(ENV_VARIANTS[env], KILN_SIMD=simd), tag)
        if self.keep:
            with open(os.path.join(self.keep, tag.replace(" ", "_") + ".txt"), "wb") as f:
                f.write(out)
        gen = [[] for _ in prompts]
        for line in out.decode().splitlines():
            w = line.split()
            if len(w) >= 4 and w[1] != "finish" and w[0] != "req":
                gen[int(w[0])].append(w[2])
        return "%s ids:%s" % (hashlib.sha256(out).hexdigest()[:HASH_HEX],
                              "/".join(",".join(g) for g in gen))

    def run_case(self, m, simd, kv, threads, tag):
        out = self.cmd([self.kiln, "run", "-m", self.path(m), "-p", m["run"], "-n", str(N_GEN),
                        "--temp", "0", "--json", "-t", str(threads), "--kv-type", kv],
                       {"KILN_SIMD": simd}, tag)
        o = json.loads(out)
        return "prompt:%s gen:%s" % (",".join(map(str, o["prompt_ids"])),
                                     ",".join(map(str, o["generated_ids"])))


def model_ids(m, shared, kiln, runner):
    """(logits ids, decode prompt ids) of a model, for `make`."""
    src = m["ids"]
    if src.startswith("@"):
        L, P = model_ids(BY_KEY[src[1:]], shared, kiln, runner)
    elif src == "ref":
        ref = os.path.join(shared, m["src"], "reference.safetensors")
        L, P = st_ids(ref, "input_ids"), st_ids(ref, "prompt_ids")
    else:
        out = runner.cmd([kiln, "tokenize", "-m", runner.path(m), "--add-special", TEXT],
                         what="tokenize " + m["key"])
        ids = json.loads(out)
        L, P = ids[:N_TEXT_IDS], ids[:N_TEXT_PROMPT]
    if "n_ids" in m:
        L = L[:m["n_ids"]]
    return L, P


def cases(paths, quick, have_vnni):
    """Every case: (tag, kind, model key, simd, kv, threads, variant); the tags (the first six
    words of a golden line) are unique."""
    out = []

    def add(kind, mk, simd, kv, t, variant):
        out.append(("%s %s %s %s t%d %s" % (kind, mk, simd, kv, t, variant), kind, mk, simd, kv,
                    t, variant))

    for m in MODELS:
        k = m["key"]
        for simd in paths:
            for kv in KV_TYPES:
                if quick and k in QUICK_SLOW and simd != "avx512" and kv != "f32":
                    continue
                add("logits", k, simd, kv, 1, "-")
                add("decode", k, simd, kv, 1, "-")
            if quick:
                continue
            for t in THREADS if k in THREAD_MODELS else []:
                add("logits", k, simd, "f32", t, "-")
                add("decode", k, simd, "f32", t, "-")
            if m.get("quant"):
                add("logits", k, simd, "f32", 1, "q8act0")
                add("decode", k, simd, "f32", 1, "q8act0")
                if simd == "avx512" and have_vnni:
                    add("logits", k, simd, "f32", 1, "vnni0")
            if k in REPACK_MODELS:
                add("logits", k, simd, "f32", 1, "repack0")
                add("decode", k, simd, "f32", 1, "repack0")
            if k in CHUNK_MODELS:
                add("decode", k, simd, "f32", 1, "chunk5")
            if k in BATCH_MODELS:
                add("decode", k, simd, "f32", 1, "batch3")
                add("decode", k, simd, "f16", 2, "batch3")
            if "run" in m:
                add("run", k, simd, "f32", 1, "-")
                if simd == paths[-1]:
                    add("run", k, simd, "f16", 1, "-")
    return out


def run_one(runner, ids, c):
    t0 = time.monotonic()
    r = run_one_(runner, ids, c)
    if runner.verbose:
        print("%6.2fs %s" % (time.monotonic() - t0, c[0]), flush=True)
    return r


def run_one_(runner, ids, c):
    tag, kind, mk, simd, kv, t, variant = c
    m = BY_KEY[mk]
    L, P = ids[mk]
    env = variant if variant in ENV_VARIANTS else "-"
    if kind == "logits":
        return runner.logits(m, L, simd, kv, t, env, tag)
    if kind == "run":
        return runner.run_case(m, simd, kv, t, tag)
    prompts = [P]
    if variant == "batch3":  # the prompt with two others of other lengths, submitted together
        prompts = [P, L[7:27], L[:3]]
    chunk = 5 if variant == "chunk5" else 0
    return runner.decode_case(m, prompts, simd, kv, t, env, chunk, tag)


def parse_goldens(path):
    g = {"file": {}, "ids": {}, "case": {}, "header": []}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                g["header"].append(line)
                continue
            w = line.split(" ")
            if w[0] == "file":
                g["file"][w[1]] = w[2]
            elif w[0] == "ids":
                g["ids"][w[1]] = ([int(x) for x in w[2].split(",")],
                                  [int(x) for x in w[3].split(",")])
            else:
                g["case"][" ".join(w[:6])] = " ".join(w[6:])
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["make", "check", "list"])
    ap.add_argument("--kiln", required=False)
    ap.add_argument("--decode", required=False)
    ap.add_argument("--shared", required=True)
    ap.add_argument("-o", "--output", help="make: the goldens file to write")
    ap.add_argument("-g", "--goldens", help="check: the goldens file")
    ap.add_argument("--quick", action="store_true",
                    help="check: the reduced set (for sanitizer builds)")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--only", help="check/list: only the cases whose name matches this regex")
    ap.add_argument("--force-env", action="append", default=[], metavar="NAME=VALUE",
                    help="set NAME=VALUE for every command, over the case's own settings "
                         "(to show that a setting moves the bits)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each case's time")
    ap.add_argument("--keep", help="copy every output to this directory (for diffs)")
    ap.add_argument("--header", action="append", default=[],
                    help="make: a comment line for the goldens file's header")
    args = ap.parse_args()

    needed = [m["src"] for m in MODELS if not m["src"].startswith("@")]
    needed += [a for m in MODELS for a in m.get("make", []) if a.startswith(M)]
    missing = sorted({p for p in needed if not os.path.exists(os.path.join(args.shared, p))})
    if not os.path.isdir(args.shared):
        print("SKIP: the reference data directory %s is absent" % args.shared)
        return SKIP
    if missing:
        print("SKIP: reference data absent in %s: %s" % (args.shared, " ".join(missing)))
        return SKIP

    if args.mode != "list" and not (args.kiln and args.decode and (args.output or args.goldens)):
        ap.error("make needs --kiln, --decode and -o; check needs --kiln, --decode and -g")
    paths = cpu_paths()
    skipped = [p for p in SIMD_PATHS if p not in paths]
    have_vnni = vnni()
    if args.mode == "make" and (skipped or not have_vnni):
        print("make: this CPU lacks %s; the goldens need every path" % (skipped or "VNNI"))
        return 1
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)

    goldens = parse_goldens(args.goldens) if args.mode == "check" else None
    all_cases = cases(paths, args.quick, have_vnni)
    if args.only:
        if args.mode == "make":
            print("make: --only would leave cases out of the goldens")
            return 2
        all_cases = [c for c in all_cases if re.search(args.only, c[0])]
    if args.mode == "list":
        for c in all_cases:
            print(c[0])
        return 0
    if skipped:
        print("SIMD paths skipped (this CPU lacks them): %s" % " ".join(skipped))
    if not have_vnni:
        print("vnni0 cases skipped (this CPU has no AVX512-VNNI)")

    tmp = tempfile.mkdtemp(prefix="kiln-golden-")
    fails = []
    results = {}
    try:
        runner = Runner(args, tmp)
        files = {}
        for m in MODELS:
            if "make" in m:
                try:
                    files[m["key"]] = runner.make_file(m)
                except RuntimeError as e:
                    fails.append("file %s: %s" % (m["key"], e))
                    continue
                if goldens and goldens["file"].get(m["key"]) != files[m["key"]]:
                    fails.append("file %s: sha256 %s, golden %s (the made model file differs: "
                                 "kiln %s changed)" % (m["key"], files[m["key"]],
                                                       goldens["file"].get(m["key"]),
                                                       m["make"][0]))
        if goldens:
            ids = goldens["ids"]
        else:
            ids = {m["key"]: model_ids(m, args.shared, args.kiln, runner) for m in MODELS}
        runnable = [c for c in all_cases if c[2] in ids and
                    (not BY_KEY[c[2]]["src"].startswith("@") or c[2] in runner.made)]
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as ex:
            futs = {c[0]: ex.submit(run_one, runner, ids, c) for c in runnable}
            for c in runnable:
                try:
                    results[c[0]] = futs[c[0]].result()
                except RuntimeError as e:
                    fails.append("ERROR %s" % e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if args.mode == "make":
        if fails:
            print("\n".join(fails))
            return 1
        with open(args.output, "w") as f:
            for h in args.header:
                f.write("# %s\n" % h)
            f.write("# lines: file KEY SHA256 | ids KEY LOGITS_IDS PROMPT_IDS | "
                    "KIND MODEL SIMD KV THREADS VARIANT RESULT\n")
            for k, h in files.items():
                f.write("file %s %s\n" % (k, h))
            for k, (L, P) in ids.items():
                f.write("ids %s %s %s\n" % (k, ",".join(map(str, L)), ",".join(map(str, P))))
            for c in all_cases:
                f.write("%s %s\n" % (c[0], results[c[0]]))
        print("wrote %d cases and %d files to %s" % (len(all_cases), len(files), args.output))
        return 0

    n_ok = 0
    for c in all_cases:
        tag = c[0]
        want = goldens["case"].get(tag)
        got = results.get(tag)
        if want is None:
            fails.append("MISSING %s: no golden line for this case" % tag)
        elif got is None:
            pass  # its error or its model file's failure is already listed
        elif got != want:
            note = ""
            if c[1] == "logits":
                same_arg = got.split()[1] == want.split()[1]
                note = " (argmax per position %s)" % ("the same: the bits drifted" if same_arg
                                                      else "differs too")
            fails.append("MISMATCH %s%s\n    golden: %s\n    got:    %s" % (tag, note, want, got))
        else:
            n_ok += 1
    print("%d of %d cases match the goldens (%s)" % (n_ok, len(all_cases), args.goldens))
    if fails:
        print("\n".join(fails))
        print("FAIL: %d differences" % len(fails))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
