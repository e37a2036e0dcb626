#!/usr/bin/python3
"""Plots one or more training runs from their metrics.jsonl.

usage: dev/plot.py RUN_DIR [RUN_DIR ...] -o FILE.png [--baseline 124M] [--baseline-loss X]
                   [--baseline-hellaswag Y] [--title TEXT]

Panels (each drawn when at least one run has its metric): train and validation loss, HellaSwag
accuracy (acc_norm), learning rate, gradient norm, tokens/s; for a mixture of experts the
load-balancing (auxiliary) loss, the expert imbalance (the most-loaded expert's tokens over the
mean) and the expert load (each expert's share of the routed tokens, the first such run's, one line
per expert: a collapsing router shows lines leaving 1/E). One colour per run, labelled by its
directory; validation loss dashed. Reference lines: --baseline 124M draws OpenAI's GPT-2 124M
(validation loss 3.28 on FineWeb as measured by llm.c, HellaSwag acc_norm 0.294);
--baseline-loss / --baseline-hellaswag draw your own. Prints the panels it drew.
Needs matplotlib (Debian's python3-matplotlib, installed by scripts/install_deps.sh).
"""
import argparse
import json
import math
import os
import sys

BASELINES = {"124M": {"loss": 3.28, "hellaswag": 0.294}}
# (title, [(metrics key, line style, label suffix)], log scale)
PANELS = [
    ("loss", [("train_loss", "-", "train"), ("val_loss", "--", "val")], False),
    ("HellaSwag acc_norm", [("hellaswag_acc_norm", "-o", "")], False),
    ("learning rate", [("lr", "-", "")], False),
    ("gradient norm", [("grad_norm", "-", "")], True),
    ("tokens/s", [("tokens_per_s", "-", "")], False),
    ("load-balancing loss", [("aux_loss", "-", "")], False),
    ("expert imbalance", [("expert_imbalance", "-", "")], False),
]
EXPERT_LOAD = "expert load"  # drawn from "expert_tokens" lists


class InputError(Exception):
    pass


def read_run(directory):
    """{key: ([steps], [values])} from DIR/metrics.jsonl; non-finite values and bad lines skipped."""
    path = os.path.join(directory, "metrics.jsonl")
    if not os.path.isdir(directory):
        raise InputError(f"{directory}: not a directory")
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}")
    series = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if not isinstance(record, dict) or "step" not in record:
            continue
        tokens = record.get("expert_tokens")
        if isinstance(tokens, list) and tokens and sum(tokens) > 0:
            steps, shares = series.setdefault("expert_tokens", ([], []))
            steps.append(record["step"])
            shares.append([t / sum(tokens) for t in tokens])
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                steps, values = series.setdefault(key, ([], []))
                steps.append(record["step"])
                values.append(value)
    if not series:
        raise InputError(f"{path}: no metrics records")
    return series


def run(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run's --out-dir (holds metrics.jsonl)")
    ap.add_argument("-o", "--output", required=True, help="PNG file to write")
    ap.add_argument("--baseline", choices=sorted(BASELINES), help="reference lines of a published model")
    ap.add_argument("--baseline-loss", type=float, help="a reference validation loss line")
    ap.add_argument("--baseline-hellaswag", type=float, help="a reference HellaSwag acc_norm line (0..1)")
    ap.add_argument("--title", default=None, help="figure title (default: the run directories)")
    args = ap.parse_args(argv)
    runs = [(os.path.basename(os.path.normpath(d)) or d, read_run(d)) for d in args.runs]
    reference = dict(BASELINES.get(args.baseline, {}))
    if args.baseline_loss is not None:
        reference["loss"] = args.baseline_loss
    if args.baseline_hellaswag is not None:
        reference["hellaswag"] = args.baseline_hellaswag

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS if any(key in series for _, series in runs for key, _, _ in p[1])]
    load = next(((name, series["expert_tokens"]) for name, series in runs if "expert_tokens" in series), None)
    if load is not None:
        panels.append((EXPERT_LOAD, [], False))
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, lines, log_scale) in zip(axes.flat, panels):
        if title == EXPERT_LOAD:
            name, (steps, shares) = load
            for e in range(len(shares[0])):
                ax.plot(steps, [s[e] for s in shares], "-", linewidth=0.8, label=f"expert {e}" if e < 8 else None)
            ax.axhline(1 / len(shares[0]), color="grey", linestyle=":", label="1/E")
            title = f"{EXPERT_LOAD} ({name})"
        for index, (name, series) in enumerate(runs):
            for key, style, suffix in lines:
                if key in series:
                    steps, values = series[key]
                    label = f"{name} {suffix}".strip()
                    ax.plot(steps, values, style, color=colours[index % len(colours)], label=label,
                            markersize=3, linewidth=1.2)
        if title == "loss" and "loss" in reference:
            ax.axhline(reference["loss"], color="grey", linestyle=":", label=f"baseline {reference['loss']}")
        if title.startswith("HellaSwag") and "hellaswag" in reference:
            ax.axhline(reference["hellaswag"], color="grey", linestyle=":",
                       label=f"baseline {reference['hellaswag']}")
        if log_scale:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(args.title or ", ".join(name for name, _ in runs))
    fig.tight_layout()
    try:
        fig.savefig(args.output, dpi=100)
    except OSError as e:
        raise InputError(f"{args.output}: cannot write: {e.strerror}")
    print(f"{args.output}: {len(runs)} run(s); panels: " + ", ".join(title for title, _, _ in panels))


if __name__ == "__main__":
    try:
        run(sys.argv[1:])
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
