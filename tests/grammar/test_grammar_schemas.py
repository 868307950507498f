#!/usr/bin/env python3
"""test_grammar_schemas.py - every output generated under each of the JSON schemas in
schemas/ parses and validates against its schema (python3-jsonschema, Draft 2020-12).

    test_grammar_schemas.py GRAMMAR_GEN MODEL MAX_TOKENS N_SEEDS OUT_DIR [--no-jump]

Runs GRAMMAR_GEN (grammar_gen.c: all schemas x seeds at temperature 1, concurrently through
one engine) and checks each output: finish reason "stop", json.loads succeeds, and
Draft202012Validator(schema).validate passes. Exits 77 (skip) when the model is missing.
"""
import glob
import json
import os
import subprocess
import sys

try:
    import jsonschema
except ImportError:
    print("SKIP: python3-jsonschema is not installed (apt-get install python3-jsonschema)")
    sys.exit(77)


def main():
    gen, model, max_tokens, n_seeds, out_dir = sys.argv[1:6]
    extra = sys.argv[6:]
    if not os.path.exists(model):
        print(f"SKIP: model {model} is missing")
        sys.exit(77)
    here = os.path.dirname(os.path.abspath(__file__))
    schemas = sorted(glob.glob(os.path.join(here, "schemas", "*.json")))
    assert len(schemas) >= 30, f"expected 30 schemas, found {len(schemas)}"
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, os.path.basename(model) + ("-nojump" if extra else "") + ".jsonl")
    subprocess.run([gen, model, out, max_tokens, n_seeds] + extra + schemas, check=True)
    validators = {}
    for s in schemas:
        with open(s) as f:
            sch = json.load(f)
        jsonschema.Draft202012Validator.check_schema(sch)
        validators[s] = jsonschema.Draft202012Validator(sch)
    fails, n, fill = 0, 0, 0
    with open(out) as f:
        for line in f:
            r = json.loads(line)
            n += 1
            fill += r.get("fill", 0)
            name = os.path.basename(r["schema"])
            what = f"{name} seed {r['seed']}"
            if r["finish"] != "stop" or r["text"] is None:
                print(f"FAIL {what}: finish {r['finish']} {r.get('message', '')!r}, text {r['text']!r}")
                fails += 1
                continue
            try:
                v = json.loads(r["text"])
            except ValueError as ex:
                print(f"FAIL {what}: not JSON ({ex}): {r['text']!r}")
                fails += 1
                continue
            errs = list(validators[r["schema"]].iter_errors(v))
            if errs:
                print(f"FAIL {what}: {errs[0].message}: {r['text']!r}")
                fails += 1
                continue
            print(f"ok   {what}: {r['tokens']} tokens ({r.get('fill', 0)} jump-forward): {r['text'][:100]!r}")
    print(f"{n - fails}/{n} outputs valid; {fill} jump-forward tokens in all")
    if n != len(schemas) * int(n_seeds):
        print(f"FAIL: {n} outputs, expected {len(schemas) * int(n_seeds)}")
        sys.exit(1)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
