#!/usr/bin/env python3
"""Draft acceptance on a real model: pycode10M (a Llama trained on Python) continuing held-out
Python files from its valid.txt (issue 18, no goal; bench/spec/run.sh calls this).

valid.txt is held-out source files joined end to end with no separator. A file start is taken
to be line 0 and every line that opens a module the way these files do ("# Copyright ...",
"#!..." or a docstring '\"\"\"Text'), unless the last non-blank line before it is a comment
(the docstring after a licence header). For each of the
first --files starts whose file is long enough:
  prompt        the file's first lines, at least --prompt-chars characters (whole lines, the
                last one without its newline: the newline and the next line's indentation
                are one token of this vocabulary, so the prompt stops before it);
  continuation  the lines after it, at least --cont-chars characters: the file's real text;
  edited        that continuation with --edits lines edited (at 1/(e+1), 2/(e+1), ... of its
                non-blank lines, the first identifier of 3+ characters renamed to NAME_v2, or
                " # edited" appended when it has none).
Two tasks per file:
  continue      the prompt is the file's start; the model continues the file;
  repeat        the prompt is the file's start, a blank line and its first --primer-lines
                lines again (a copy task: "repeat this document"), the continuation the start's
                next lines (at least --cont-chars characters), edited as above.
Each prompt runs through `kiln run --json --temp 0 -n N` (greedy) four times:
  plain                        no speculation (the reference output);
  --spec ngram                 prompt lookup over the prompt and the output;
  --prediction-file edited     the edited continuation as the prediction;
  --prediction-file real       the unedited continuation (how much of the file the model
                               reproduces at all).
Every speculative output must equal the plain one (exact speculation). Prints one JSON object:
per file and summed: drafted, accepted, acceptance (accepted / drafted), verify steps, and
for predictions accepted / rejected prediction tokens (OpenAI's accounting).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def file_starts(lines):
    starts, prev = [0], ""  # prev: the last non-blank line
    for i in range(1, len(lines)):
        cur = lines[i]
        opens = cur.startswith(("# Copyright", "#!")) or re.match(r'^"""\S', cur)
        if opens and not prev.startswith("#"):  # not the docstring after a licence header
            starts.append(i)
        if cur.strip():
            prev = cur
    return starts


def take_lines(lines, start, end, min_chars):
    """Lines [start, j) with at least min_chars characters (newlines counted), j <= end."""
    n, j = 0, start
    while j < end and n < min_chars:
        n += len(lines[j]) + 1
        j += 1
    return j if n >= min_chars else None


def edit_lines(cont_lines, n_edits):
    out = list(cont_lines)
    idx = [i for i, l in enumerate(out) if l.strip()]
    if not idx:
        return out, []
    picked = sorted({idx[min(len(idx) - 1, (k + 1) * len(idx) // (n_edits + 1))]
                     for k in range(n_edits)})
    for i in picked:
        m = re.search(r"[A-Za-z_][A-Za-z0-9_]{2,}", out[i])
        if m:
            out[i] = out[i][: m.end()] + "_v2" + out[i][m.end():]
        else:
            out[i] = out[i] + "  # edited"
    return out, picked


def run(kiln, model, threads, prompt, n, extra):
    cmd = [kiln, "run", "-m", model, "-t", str(threads), "--temp", "0", "-n", str(n), "--json",
           "-p", prompt] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"pycode_accept: {' '.join(cmd[:8])} ... failed ({p.returncode}): {p.stderr}")
    return json.loads(p.stdout)


def write_tmp(work, name, text):
    fd, path = tempfile.mkstemp(prefix=f"pycode-{name}-", suffix=".py", dir=work)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def measure(a, prompt, cont_lines, paths_out):
    """The plain run and the three speculative ones of one prompt; cont_lines: the text that
    really follows it (lines; the prompt ends before the newline that leads to them)."""
    edited, picked = edit_lines(cont_lines, a.edits)
    real_p = write_tmp(a.work, "real", "\n" + "\n".join(cont_lines))
    edit_p = write_tmp(a.work, "edited", "\n" + "\n".join(edited))
    paths_out += [real_p, edit_p]
    plain = run(a.kiln, a.model, a.t, prompt, a.n, [])
    row = {"prompt_tokens": len(plain["prompt_ids"]), "generated_tokens": len(plain["generated_ids"]),
           "edited_lines": picked}
    for name, extra in (("ngram", ["--spec", "ngram"]),
                        ("edited", ["--prediction-file", edit_p]),
                        ("real", ["--prediction-file", real_p])):
        r = run(a.kiln, a.model, a.t, prompt, a.n, extra)
        sp = r["speculation"]
        row[name] = {"drafted": sp["drafted_tokens"], "accepted": sp["accepted_tokens"],
                     "verify_steps": sp["verify_steps"],
                     "accepted_prediction_tokens": sp["accepted_prediction_tokens"],
                     "rejected_prediction_tokens": sp["rejected_prediction_tokens"],
                     "acceptance": sp["accepted_tokens"] / sp["drafted_tokens"]
                     if sp["drafted_tokens"] else 0.0,
                     "outputs_match": r["generated_ids"] == plain["generated_ids"]}
    return row


KEYS = ("drafted", "accepted", "verify_steps", "accepted_prediction_tokens",
        "rejected_prediction_tokens")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--valid", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--prompt-chars", type=int, default=1000)
    ap.add_argument("--cont-chars", type=int, default=500)
    ap.add_argument("--edits", type=int, default=3)
    ap.add_argument("--primer-lines", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    a = ap.parse_args()

    lines = open(a.valid, encoding="utf-8").read().split("\n")
    starts = file_starts(lines) + [len(lines)]
    os.makedirs(a.work, exist_ok=True)
    tasks = ("continue", "repeat")
    phases = ("ngram", "edited", "real")
    total = {t: {p: dict.fromkeys(KEYS, 0) for p in phases} for t in tasks}
    files, mismatches, tmp = [], 0, []
    for s, e in zip(starts, starts[1:]):
        if len(files) == a.files:
            break
        pe = take_lines(lines, s, e, a.prompt_chars)
        ce = take_lines(lines, pe, e, a.cont_chars) if pe else None
        if not ce:
            continue
        head = lines[s:pe]
        k = a.primer_lines
        rows = {
            # the file's start; the model continues it, the prediction is what follows
            "continue": measure(a, "\n".join(head), lines[pe:ce], tmp),
            # the file's start, a blank line, then its first lines again: the model repeats
            # it (a copy task), the prediction is the rest of the start
            "repeat": measure(a, "\n".join(head) + "\n\n" + "\n".join(head[:k]),
                              head[k:take_lines(head, k, len(head), a.cont_chars) or len(head)], tmp),
        }
        files.append({"line": s + 1, "first_line": lines[s][:60], **rows})
        for t in tasks:
            for p in phases:
                mismatches += 0 if rows[t][p]["outputs_match"] else 1
                for key in KEYS:
                    total[t][p][key] += rows[t][p][key]
    for path in tmp:
        os.remove(path)
    for t in tasks:
        for p in phases:
            x = total[t][p]
            x["acceptance"] = x["accepted"] / x["drafted"] if x["drafted"] else 0.0
            n_pred = x["accepted_prediction_tokens"] + x["rejected_prediction_tokens"]
            x["prediction_accepted_share"] = x["accepted_prediction_tokens"] / n_pred if n_pred else 0.0
    print(json.dumps({"model": a.model, "gen_tokens": a.n, "edits_per_file": a.edits,
                      "files": files, "total": total, "outputs_match": mismatches == 0}))


if __name__ == "__main__":
    main()
