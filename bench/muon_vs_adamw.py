"""AdamW against Muon (train.optimizer: muon) on 2 CPU ranks: a small learning-rate sweep of each
on the quick start (configs/quickstart.yaml) and llama-tiny (configs/llama-tiny.yaml), the best
run of each (lowest validation loss at the end) as loss against steps and against wall time in a
plot (docs/muon-vs-adamw.png) and a table; then Muon's step time against AdamW's under each
ddp.shard mode. Prints markdown tables for bench/RESULTS.md.

usage: python bench/muon_vs_adamw.py TRAINER OUTDIR [--quick] [--overhead]
  (run from the repository root: the configs' data paths are relative to it)

Every run: mpirun -np 2 TRAINER --config CONFIG --set ... with log.every 10, metrics.jsonl
(the training loss and wall time of every logged step, the validation loss of every evaluation).
Muon's runs keep AdamW's best learning rate for their AdamW group (embeddings, output layer,
norms, biases) and sweep train.muon_lr. --quick: a third of the steps (the overhead: 60 steps
instead of 120). --overhead: only the step-time table.
"""
import json
import os
import re
import subprocess
import sys

CONFIGS = {
    "quickstart": {"config": "configs/quickstart.yaml", "steps": 600, "eval_every": 100,
                   "adamw": [1e-3, 3e-3, 1e-2], "muon": [0.005, 0.01, 0.02, 0.04]},
    "llama-tiny": {"config": "configs/llama-tiny.yaml", "steps": 200, "eval_every": 50,
                   "adamw": [1e-3, 2e-3, 6e-3], "muon": [0.005, 0.01, 0.02, 0.04]},
}
MODES = ["none", "optimizer", "gradients", "parameters"]
COMMON = ["--set", "log.every=10", "--set", "log.progress=off", "--set", "train.sample_every=0",
          "--set", "checkpoint.dir=", "--set", "train.eval_samples=256"]


def run(trainer, outdir, name, config, sets):
    metrics = os.path.join(outdir, name + ".jsonl")
    if os.path.exists(metrics):
        os.unlink(metrics)
    cmd = ["mpirun", "-np", "2", trainer, "--config", config, *COMMON,
           "--set", f"log.metrics={metrics}"]
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, capture_output=True, text=True)
    log = done.stdout + done.stderr
    with open(os.path.join(outdir, name + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + log)
    if done.returncode != 0:
        sys.exit(f"{name}: exit {done.returncode}\n{log[-3000:]}")
    records = [json.loads(line) for line in open(metrics)]
    steps = [r for r in records if r["type"] == "step"]
    evals = [r for r in records if r["type"] == "eval"]
    rate = re.search(r"done: .*?([0-9.]+) samples/s", log)
    return {"name": name, "steps": steps, "evals": evals,
            "samples_per_s": float(rate.group(1)) if rate else 0.0,
            "final_eval": evals[-1]["loss"], "final_wall": steps[-1]["wall_s"]}


def sweep(trainer, outdir, key, c, quick):
    steps = c["steps"] // 3 if quick else c["steps"]
    base = [f"train.steps={steps}", f"train.eval_every={c['eval_every']}"]
    runs = {"adamw": [], "muon": []}
    for lr in c["adamw"]:
        runs["adamw"].append(run(trainer, outdir, f"{key}-adamw-{lr:g}", c["config"],
                                 base + [f"train.lr={lr}"]) | {"lr": lr})
    best_adamw = min(runs["adamw"], key=lambda r: r["final_eval"])
    for lr in c["muon"]:
        runs["muon"].append(run(trainer, outdir, f"{key}-muon-{lr:g}", c["config"],
                                base + [f"train.lr={best_adamw['lr']}", "train.optimizer=muon",
                                        f"train.muon_lr={lr}"]) | {"lr": lr})
    return runs


def smoothed(values, k=5):
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1])
            for i in range(len(values))]


def steps_to_reach(r, target):
    """The first evaluation step whose validation loss is at or below `target` (None: never)."""
    return next((e["step"] for e in r["evals"] if e["loss"] <= target), None)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for row, (key, runs) in enumerate(results.items()):
        for opt, colour in (("adamw", "tab:blue"), ("muon", "tab:red")):
            best = min(runs[opt], key=lambda r: r["final_eval"])
            label = f"{'AdamW' if opt == 'adamw' else 'Muon'} (lr {best['lr']:g})"
            steps = [s["step"] for s in best["steps"]]
            loss = smoothed([s["loss"] for s in best["steps"]])
            wall = [s["wall_s"] for s in best["steps"]]
            axes[row][0].plot(steps, loss, color=colour, label=label + ", training")
            axes[row][0].plot([e["step"] for e in best["evals"]],
                              [e["loss"] for e in best["evals"]], "o--", color=colour,
                              label=label + ", validation")
            axes[row][1].plot(wall, loss, color=colour, label=label + ", training")
        axes[row][0].set(title=f"{key}: loss against steps", xlabel="step", ylabel="loss")
        axes[row][1].set(title=f"{key}: loss against wall time (2 CPU ranks)",
                         xlabel="seconds", ylabel="loss")
        for ax in axes[row]:
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def tables(results):
    print("| config | optimizer | lr (swept) | best | validation loss | training loss (last 5 "
          "logged) | steps to AdamW's final validation loss | wall s | samples/s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for key, runs in results.items():
        target = min(r["final_eval"] for r in runs["adamw"])
        for opt in ("adamw", "muon"):
            best = min(runs[opt], key=lambda r: r["final_eval"])
            swept = ", ".join(f"{r['lr']:g}: {r['final_eval']:.3f}" for r in runs[opt])
            last = sum(s["loss"] for s in best["steps"][-5:]) / len(best["steps"][-5:])
            reach = steps_to_reach(best, target)
            print(f"| {key} | {opt} | {swept} | {best['lr']:g} | {best['final_eval']:.4f} | "
                  f"{last:.4f} | {reach if reach else '-'} | {best['final_wall']:.1f} | "
                  f"{best['samples_per_s']:.1f} |")


def overhead(trainer, outdir, quick):
    print("\n| ddp.shard | AdamW samples/s | Muon samples/s | Muon step time / AdamW's |")
    print("|---|---:|---:|---:|")
    steps = 60 if quick else 120
    for mode in MODES:
        rates = {}
        for opt in ("adamw", "muon"):
            r = run(trainer, outdir, f"overhead-{mode}-{opt}", "configs/quickstart.yaml",
                    [f"train.steps={steps}", "train.warmup_steps=5", "train.eval_every=100000",
                     f"ddp.shard={mode}",
                     f"train.optimizer={opt}"])
            rates[opt] = r["samples_per_s"]
        print(f"| {mode} | {rates['adamw']:.1f} | {rates['muon']:.1f} | "
              f"{rates['adamw'] / rates['muon']:.3f} |")


def main(trainer, outdir, quick, only_overhead):
    os.makedirs(outdir, exist_ok=True)
    if only_overhead:
        overhead(trainer, outdir, quick)
        return
    results = {k: sweep(trainer, outdir, k, c, quick) for k, c in CONFIGS.items()}
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(results, f)
    plot(results, "docs/muon-vs-adamw.png")
    tables(results)
    overhead(trainer, outdir, quick)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--quick", "--overhead")]
    if len(args) != 2:
        sys.exit(__doc__)
    main(args[0], args[1], "--quick" in sys.argv, "--overhead" in sys.argv)
