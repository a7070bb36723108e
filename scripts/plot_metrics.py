#!/usr/bin/env python3
"""Plots a run's metrics (the trainer's log.metrics JSON Lines file) as PNG figures:

    scripts/plot_metrics.py runs/x/metrics.jsonl [-o DIR]       (default DIR: beside the file)

Writes DIR/loss.png (training loss and the validation loss), DIR/eval.png (the other validation
metrics: PSNR, HR@10, bits per byte, each eval.tasks task's acc and acc_norm, ... when there
are any), DIR/lr.png, DIR/throughput.png (samples/s and
tokens/s) and DIR/memory.png (each rank's peak tensor memory), with steps where a memory fallback
was taken (or an fp16 step was skipped) marked on every figure. Needs matplotlib, which
scripts/bootstrap.sh --dev installs in the project's virtualenv: under another Python (the
system's python3) the script runs itself again under that one (scripts/project_python.py)."""
import argparse
import json
import os
import sys

try:
    import matplotlib
except ModuleNotFoundError as e:  # e.g. the system python3: run again under the project's Python
    import project_python  # beside this file: the standard library only
    project_python.reexec(__file__, e.name)

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    steps, evals = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics.py: {path}:{number}: not JSON ({e.msg})")
            if record.get("type") == "eval":
                # a task of eval.tasks: {"acc": A, "acc_norm": B, "examples": N} -> fractions
                for name, value in list(record.items()):
                    if isinstance(value, dict) and value.get("examples"):
                        del record[name]
                        for k in ("acc", "acc_norm"):
                            record[f"{name} {k}"] = value[k] / value["examples"]
            (evals if record.get("type") == "eval" else steps).append(record)
    if not steps and not evals:
        sys.exit(f"plot_metrics.py: {path}: no records")
    return steps, evals


def events(steps, key):
    """Steps at which the cumulative counter `key` went up."""
    out, last = [], 0
    for r in steps:
        if r.get(key, 0) > last:
            out.append(r["step"])
        last = r.get(key, last)
    return out


def mark(ax, fallbacks, skipped):
    for i, s in enumerate(fallbacks):
        ax.axvline(s, color="tab:red", linestyle="--", linewidth=1,
                   label="memory fallback" if i == 0 else None)
    for i, s in enumerate(skipped):
        ax.axvline(s, color="tab:orange", linestyle=":", linewidth=1,
                   label="skipped step (fp16)" if i == 0 else None)


def figure(path, title, ylabel, draw, fallbacks, skipped, log_y=False):
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    draw(ax)
    mark(ax, fallbacks, skipped)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(path)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("metrics")
    p.add_argument("-o", "--out", help="directory for the PNG files (default: the metrics file's)")
    a = p.parse_args()
    if not os.path.exists(a.metrics):
        sys.exit(f"plot_metrics.py: {a.metrics}: no such file")
    steps, evals = read(a.metrics)
    out = a.out or os.path.dirname(os.path.abspath(a.metrics))
    os.makedirs(out, exist_ok=True)
    fallbacks, skipped = events(steps, "fallbacks"), events(steps, "skipped_steps")
    x = [r["step"] for r in steps]

    def loss(ax):
        ax.plot(x, [r["loss"] for r in steps], label="training loss")
        ev = [r for r in evals if "loss" in r]
        if ev:
            ax.plot([r["step"] for r in ev], [r["loss"] for r in ev], "o-", label="validation loss")
    figure(os.path.join(out, "loss.png"), "loss", "loss", loss, fallbacks, skipped)

    others = sorted({k for r in evals for k in r} - {"type", "step", "samples", "wall_s", "loss"})
    if others:
        def metric(ax):
            for k in others:
                ev = [r for r in evals if k in r]
                ax.plot([r["step"] for r in ev], [r[k] for r in ev], "o-", label=k)
        figure(os.path.join(out, "eval.png"), "validation metrics", "value", metric, fallbacks,
               skipped)

    figure(os.path.join(out, "lr.png"), "learning rate", "lr",
           lambda ax: ax.plot(x, [r["lr"] for r in steps], label="lr"), fallbacks, skipped)

    def throughput(ax):
        ax.plot(x, [r["samples_per_s"] for r in steps], label="samples/s")
        if any("tokens_per_s" in r for r in steps):
            ax2 = ax.twinx()
            ax2.plot(x, [r.get("tokens_per_s", 0) for r in steps], color="tab:green",
                     label="tokens/s")
            ax2.set_ylabel("tokens/s")
    figure(os.path.join(out, "throughput.png"), "throughput", "samples/s", throughput, fallbacks,
           skipped)

    def memory(ax):
        ranks = max(len(r.get("memory_peak_mib", [])) for r in steps) if steps else 0
        for rank in range(ranks):
            ax.plot(x, [r["memory_peak_mib"][rank] if rank < len(r.get("memory_peak_mib", []))
                        else float("nan") for r in steps], label=f"rank {rank}")
    figure(os.path.join(out, "memory.png"), "peak tensor memory per rank", "MiB", memory, fallbacks,
           skipped)


if __name__ == "__main__":
    main()
