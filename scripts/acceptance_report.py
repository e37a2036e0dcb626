#!/usr/bin/env python3
"""Figures and reports of make gpu-acceptance (scripts/gpu_acceptance.sh): stage result files,
summary.md, the sanitizer stage's verdict, step statistics and MFU from a run's metrics.jsonl,
run-to-run and PyTorch comparisons, and the table of peak bf16 rates. Standard library only, so
any python3 runs it.

usage: acceptance_report.py record DIR STAGE ORDER STATUS SECONDS TEXT [KEY=VALUE ...]
       acceptance_report.py summary DIR [TITLE]
       acceptance_report.py sanitizer DIR LIMIT_S EXPECTED_RUNS
       acceptance_report.py throughput LOG METRICS B T WARMUP DEVICE_NAME
       acceptance_report.py same-run METRICS_A METRICS_B
       acceptance_report.py parity REFERENCE_JSON METRICS TOLERANCE
       acceptance_report.py ref-agree REFERENCE_JSON_A REFERENCE_JSON_B TOLERANCE
"""

import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys

STATUSES = ("PASS", "FAIL", "SKIP")

# Dense bf16 tensor-core peaks (TFLOP/s, datasheet, without sparsity), matched in this order as
# substrings of the device name; a name that matches none is taken as an H100 SXM.
PEAK_BF16_TFLOPS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
]
DEFAULT_PEAK = ("H100 SXM (default)", 989.0)

# Fields of a train record that depend on timing, not on the computation.
TIMING_KEYS = ("ms", "tokens_per_s", "mfu")


def fail(message):
    sys.exit(f"acceptance_report: {message}")


def parse_value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def record(directory, stage, order, status, seconds, text, pairs):
    """Writes DIRECTORY/STAGE.json and prints the stage's one-line result."""
    if status not in STATUSES:
        fail(f"status {status!r} of stage {stage} is not one of {', '.join(STATUSES)}")
    figures = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            fail(f"figure {pair!r} of stage {stage} is not KEY=VALUE")
        figures[key] = parse_value(value)
    result = {
        "stage": stage, "order": int(order), "status": status, "text": text,
        "seconds": round(float(seconds), 1), "figures": figures,
        "commit": os.environ.get("ACCEPTANCE_COMMIT") or commit(),
        "device": os.environ.get("ACCEPTANCE_DEVICE", "unknown"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, stage + ".json")
    with open(path + ".tmp", "w") as f:  # renamed into place: a killed job leaves no half-written file
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"STAGE {stage}: {status}" + (f" ({text})" if text else ""))


def load_results(directory):
    if not os.path.isdir(directory):
        fail(f"{directory} is not a directory")
    results = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, ValueError) as error:
            fail(f"{path}: not a stage result ({error})")
        missing = [k for k in ("stage", "order", "status", "text", "seconds", "figures", "commit", "date", "device")
                   if k not in result]
        if missing:
            fail(f"{path}: not a stage result (no {', '.join(missing)})")
        if result["status"] not in STATUSES:
            fail(f"{path}: status {result['status']!r} is not one of {', '.join(STATUSES)}")
        results.append(result)
    if not results:
        fail(f"{directory} holds no stage results (*.json)")
    return sorted(results, key=lambda r: r["order"])


def cell(value):
    return str(value).replace("|", "\\|").replace("\n", " ")


def summary(directory, title="GPU acceptance"):
    """Writes DIRECTORY/summary.md from the stage files in it."""
    results = load_results(directory)
    counts = {s: sum(r["status"] == s for r in results) for s in STATUSES}
    commits = sorted({r["commit"] for r in results})
    devices = sorted({r["device"] for r in results})
    lines = [f"# {title}", "",
             f"- device: {', '.join(devices)}",
             f"- commit: {', '.join(commits)}",
             f"- dates: {min(r['date'] for r in results)} to {max(r['date'] for r in results)}",
             f"- stages: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP", "",
             "| stage | status | figures | seconds | date | commit |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['stage']} | {r['status']} | {cell(r['text'])} | {r['seconds']:g} | "
                     f"{r['date']} | {r['commit']} |")
    for r in results:
        lines += ["", f"## {r['stage']}: {r['status']}", ""]
        for key, value in r["figures"].items():
            shown = value if isinstance(value, str) else json.dumps(value)
            lines.append(f"- {key}: {cell(shown)}")
    # Replaced whole (a job killed while it is written keeps the previous summary).
    path = os.path.join(directory, "summary.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    print(f"summary: {os.path.join(directory, 'summary.md')}: {counts['PASS']} PASS, "
          f"{counts['FAIL']} FAIL, {counts['SKIP']} SKIP")


SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
# A run's outcome (scripts/gpu_acceptance.sh's sanitize_one) and how the verdict words it; every
# outcome but clean fails the stage: a run cut by the time limit checked only part of its program.
SANITIZER_OUTCOMES = (("clean", "clean"), ("errors", "with errors"), ("failed", "failed"),
                      ("timeout", "cut by the {limit} s limit"))


def sanitizer(directory, limit, expected):
    """The sanitizer stage's verdict from the runs' DIR/*.result files ("tool target outcome errors
    seconds"): prints the status, then one line of text (per tool, the runs of each outcome, naming
    all but the clean ones), then the figures as KEY=VALUE lines."""
    runs = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".result"):
            with open(os.path.join(directory, name)) as f:
                fields = f.read().split()
            if len(fields) != 5 or fields[2] not in dict(SANITIZER_OUTCOMES):
                fail(f"{directory}/{name}: expected 'tool target outcome errors seconds', found {' '.join(fields)!r}")
            runs.append((fields[0], fields[1], fields[2], float(fields[4])))
    status, parts, figures = "PASS", [], [f"timeout_s={limit}", f"runs={len(runs)}"]
    if len(runs) != int(expected):
        status = "FAIL"
        parts.append(f"only {len(runs)} of {expected} runs reported")
    for tool in SANITIZER_TOOLS:
        pieces = []
        for outcome, words in SANITIZER_OUTCOMES:
            names = [target for t, target, o, _ in runs if t == tool and o == outcome]
            if not names:
                continue
            piece = f"{len(names)} {words.format(limit=limit)}"
            if outcome != "clean":
                status = "FAIL"
                piece += f" ({' '.join(names)})"
            pieces.append(piece)
        parts.append(f"{tool}: {', '.join(pieces) or 'no runs'}")
        figures.append(f"{tool}={json.dumps(', '.join(pieces))}")
    if runs:
        tool, target, _, seconds = max(runs, key=lambda r: r[3])
        figures.append(f"slowest={json.dumps(f'{tool} {target} {seconds:.1f} s')}")
    print(status)
    print("; ".join(parts))
    print("\n".join(figures))


def train_records(path):
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as error:
        fail(f"{path}: {error}")
    return [r for r in records if "train_loss" in r], records


def peak_tflops(device_name):
    for pattern, tflops in PEAK_BF16_TFLOPS:
        if pattern in device_name:
            return pattern, tflops
    return DEFAULT_PEAK


def throughput(log, metrics, batch, seq_len, warmup, device_name):
    """ms/step, tokens/s and MFU (llm.c's 6N + 6LCT flops per token) of the steps after WARMUP,
    with the trainer's planned memory; prints one JSON object."""
    text = open(log, errors="replace").read()
    model = re.search(r"^model: L=(\d+) NH=\d+ C=(\d+).*?([\d,]+) parameters", text, re.M)
    memory = re.search(r"^memory: .*total ([\d.]+) MiB", text, re.M)
    if not model or not memory:
        fail(f"{log}: no 'model: ... parameters' or 'memory: ... total X MiB' line")
    layers, channels = int(model.group(1)), int(model.group(2))
    params = int(model.group(3).replace(",", ""))
    steps = [r for r in train_records(metrics)[0] if r["step"] > warmup]
    if not steps:
        fail(f"{metrics}: no train records after step {warmup}")
    ms = statistics.median(r["ms"] for r in steps)
    tokens = batch * seq_len
    flops = (6 * params + 6 * layers * channels * seq_len) * tokens / (ms / 1000.0)
    peak_name, peak = peak_tflops(device_name)
    print(json.dumps({
        "steps_timed": len(steps), "ms_per_step": round(ms, 2),
        "ms_min": round(min(r["ms"] for r in steps), 2), "ms_max": round(max(r["ms"] for r in steps), 2),
        "tokens_per_s": round(tokens * 1000.0 / ms), "tflops": round(flops / 1e12, 1),
        "mfu_percent": round(100.0 * flops / (peak * 1e12), 1), "peak_tflops": peak, "peak_of": peak_name,
        "parameters": params, "planned_mib": float(memory.group(1)),
        "final_loss": steps[-1]["train_loss"]}))


def same_run(path_a, path_b):
    """Exit 0 if two runs' metrics.jsonl agree in every record and field but the timings."""
    _, a = train_records(path_a)
    _, b = train_records(path_b)
    strip = [[{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in run] for run in (a, b)]
    if len(a) != len(b):
        print(f"{path_a} has {len(a)} records, {path_b} has {len(b)}")
        return 1
    for ra, rb in zip(*strip):
        if ra != rb:
            print(f"first difference: {json.dumps(ra)} vs {json.dumps(rb)}")
            return 1
    print(f"{len(a)} records identical (timings aside)")
    return 0


def rel_errors(want, got):
    return [abs(g - w) / abs(w) if g is not None and math.isfinite(g) else math.inf for g, w in zip(got, want)]


def parity(reference_json, metrics, tolerance):
    """The trainer's per-step loss and gradient norm against the PyTorch reference; prints the
    largest relative error of each ("LOSS NORM"), exit 1 beyond TOLERANCE."""
    reference = json.load(open(reference_json))
    records, _ = train_records(metrics)
    worst = {}
    for key, ref_key in (("train_loss", "losses"), ("grad_norm", "grad_norms")):
        want, got = reference[ref_key], [r[key] for r in records]
        if len(got) != len(want):
            fail(f"{metrics}: {len(got)} train records, the reference has {len(want)} steps")
        worst[key] = max(rel_errors(want, got))
    print(f"{worst['train_loss']:.3g} {worst['grad_norm']:.3g}")
    return 0 if max(worst.values()) <= float(tolerance) else 1


def ref_agree(path_a, path_b, tolerance):
    """Two PyTorch references (CPU and CUDA) of the same configuration agree per step."""
    a, b = json.load(open(path_a)), json.load(open(path_b))
    worst = max(max(rel_errors(a[k], b[k])) for k in ("losses", "grad_norms"))
    print(f"{worst:.3g}")
    return 0 if worst <= float(tolerance) else 1


def main(argv):
    if not argv:
        fail("usage: see the top of scripts/acceptance_report.py")
    command, args = argv[0], argv[1:]
    if command == "record" and len(args) >= 6:
        record(args[0], args[1], args[2], args[3], args[4], args[5], args[6:])
    elif command == "summary" and len(args) in (1, 2):
        summary(*args)
    elif command == "sanitizer" and len(args) == 3:
        sanitizer(*args)
    elif command == "throughput" and len(args) == 6:
        throughput(args[0], args[1], int(args[2]), int(args[3]), int(args[4]), args[5])
    elif command == "same-run" and len(args) == 2:
        return same_run(*args)
    elif command == "parity" and len(args) == 3:
        return parity(*args)
    elif command == "ref-agree" and len(args) == 3:
        return ref_agree(*args)
    else:
        fail(f"unknown command or wrong arguments: {' '.join(argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
