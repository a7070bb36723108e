"""The learning-rate schedules (train.schedule) against a formula written here from their
definition (docs/reference.md, "Learning-rate schedules"), at every step, within 1e-12: the
trainer's metrics file records every step's learning rate (log.every 1). For each schedule and
wsd shape: a fresh run, resumes that lengthen and shorten train.steps from a checkpoint in
warmup-stable or decaying ground, and a second resume of a resumed run (the plan it saved).

usage: python schedule_test.py TRAINER
"""
import json
import math
import os
import subprocess
import sys
import tempfile

TOL = 1e-12
PEAK, MIN_RATIO, WARMUP, STEPS, FRACTION = 0.003, 0.1, 5, 40, 0.25
CASES = [("cosine", None), ("linear", None), ("constant", None),
         ("wsd", "linear"), ("wsd", "cosine"), ("wsd", "1-sqrt")]
CONFIG = """model: {{name: mlp, hidden_dim: 16, depth: 1}}
data: {{dataset: synthetic, num_samples: 256, input_dim: 8, num_classes: 4, teacher_hidden: 8}}
train: {{device: cpu, global_batch_size: 16, steps: {steps}, lr: {peak}, min_lr_ratio: {ratio},
        warmup_steps: {warmup}, schedule: {kind}, decay_fraction: {fraction},
        decay_shape: {shape}, threads: 1}}
checkpoint: {{dir: {dir}, every: 10, format: single, async: false}}
log: {{every: 1, metrics: {metrics}, progress: off}}
"""


def round_half_up(x):
    return math.floor(x + 0.5)


class Plan:
    """The definition: warmup (i + 1) / W; after it r + (1 - r) * shape(p), where the decay's
    progress p rises from p0 at the anchor a to 1 at the last step T - 1."""

    def __init__(self, kind, shape, steps, fraction=FRACTION):
        self.kind, self.shape, self.steps, self.fraction = kind, shape, steps, fraction
        self.anchor, self.p0 = self.fresh_anchor(steps), 0.0

    def fresh_anchor(self, steps):
        if self.kind != "wsd":
            return WARMUP  # cosine and linear decay from the end of warmup
        decay = round_half_up(self.fraction * steps)  # the last D steps decay
        return max(WARMUP, steps - 1 - decay)

    def progress(self, i):
        span = max(1, self.steps - 1 - self.anchor)
        return min(1.0, self.p0 + (1.0 - self.p0) * max(0, i - self.anchor) / span)

    def lr(self, i):
        if i < WARMUP:
            return PEAK * (i + 1) / WARMUP
        if self.kind == "constant":
            return PEAK
        p = self.progress(i)
        shape = {"cosine": "cosine", "linear": "linear"}.get(self.kind, self.shape)
        s = {"cosine": 0.5 * (1 + math.cos(math.pi * p)), "linear": 1 - p,
             "1-sqrt": 1 - math.sqrt(p)}[shape]
        return PEAK * (MIN_RATIO + (1 - MIN_RATIO) * s)

    def resumed(self, done, steps):
        """The plan after resuming at `done` steps with train.steps = `steps`: continue from the
        progress this plan reached there; if the decay has not begun, start it where a fresh plan
        would (or at once, if that is already past)."""
        if steps == self.steps:
            return self
        new = Plan(self.kind, self.shape, steps, self.fraction)
        p = self.progress(done)
        if p > 0:
            new.anchor, new.p0 = done, p
        else:
            new.anchor = max(new.fresh_anchor(steps), done)
        return new


def run(trainer, work, name, kind, shape, steps, resume=None):
    out = os.path.join(work, name)
    os.makedirs(out)
    metrics = os.path.join(out, "metrics.jsonl")
    config = os.path.join(out, "run.yaml")
    with open(config, "w") as f:
        f.write(CONFIG.format(steps=steps, peak=PEAK, ratio=MIN_RATIO, warmup=WARMUP, kind=kind,
                              fraction=FRACTION, shape=shape or "linear", dir=out,
                              metrics=metrics))
    cmd = [trainer, "--config", config]
    if resume:
        cmd += ["--set", f"checkpoint.resume={resume}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return out, {r["step"]: r["lr"] for r in records if r["type"] == "step"}


def check(name, lrs, plan, first):
    """Steps are logged from 1; the schedule's index is the step - 1."""
    expected_steps = set(range(first + 1, plan.steps + 1))
    if set(lrs) != expected_steps:
        sys.exit(f"{name}: logged steps {sorted(lrs)}, expected {sorted(expected_steps)}")
    worst = max(abs(lrs[s] - plan.lr(s - 1)) for s in lrs)
    if worst > TOL:
        bad = next(s for s in sorted(lrs) if abs(lrs[s] - plan.lr(s - 1)) > TOL)
        sys.exit(f"{name}: step {bad}: lr {lrs[bad]!r}, the definition gives {plan.lr(bad - 1)!r}")
    print(f"{name}: {len(lrs)} steps within {worst:.1e}")


def main(trainer):
    with tempfile.TemporaryDirectory() as work:
        for kind, shape in CASES:
            tag = kind + (f"_{shape}" if shape else "")
            plan = Plan(kind, shape, STEPS)
            out, lrs = run(trainer, work, tag, kind, shape, STEPS)
            check(tag, lrs, plan, 0)
            step = lambda n, d=out: os.path.join(d, f"step_{n:06d}.safetensors")  # noqa: E731
            # From step 20 (wsd: stable) to a longer run, and from there again with as many steps.
            longer = plan.resumed(20, 70)
            out2, lrs = run(trainer, work, tag + "_to70", kind, shape, 70, step(20))
            check(tag + " resumed at 20 to 70 steps", lrs, longer, 20)
            _, lrs = run(trainer, work, tag + "_to70_again", kind, shape, 70, step(50, out2))
            check(tag + " resumed again at 50", lrs, longer, 50)
            # Shorter: from step 20 to 25 (wsd: anneals at once), from 30 (decaying) to 35.
            _, lrs = run(trainer, work, tag + "_to25", kind, shape, 25, step(20))
            check(tag + " resumed at 20 to 25 steps", lrs, plan.resumed(20, 25), 20)
            _, lrs = run(trainer, work, tag + "_to35", kind, shape, 35, step(30))
            check(tag + " resumed at 30 to 35 steps", lrs, plan.resumed(30, 35), 30)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
