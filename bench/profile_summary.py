#!/usr/bin/env python3
"""Sums profiler traces per step phase and per operator, side by side.

    bench/profile_summary.py [--phase=NAME] trainer=prof-t/trace_rank0.json \\
        pytorch=prof-p/trace_rank0.json

Each argument is LABEL=PATH (or a PATH, labelled by its directory) of a Chrome trace written by
torch.profiler or by the trainer's log.profile (train/profiler.h). Both name the phases of a step
"step/<phase>" (user annotations); this prints, per traced step, in milliseconds:
  - each phase's wall time (its annotation's duration), and the time in no phase;
  - the operators with the most self time (an operator's time minus that of the operators it
    called), across the whole step: where the time goes inside the phases.
Steps are counted by their "step/optimizer" annotations. --phase=forward (backward, ...) sums
the operators inside that phase only."""
import collections
import json
import os
import sys


def load(path, phase=None):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events
             if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    if phase:  # operators inside that phase only
        windows = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == "step/" + phase]
        spans = [e for e in spans if e["cat"] == "user_annotation" or
                 any(a <= e["ts"] < b for a, b in windows)]
    steps = sum(1 for e in spans if e["name"] == "step/optimizer") or 1
    phases = collections.Counter()
    for e in spans:
        if e["cat"] == "user_annotation" and e["name"].startswith("step/"):
            phases[e["name"][5:]] += e["dur"]
    # Self time per operator: nesting per thread, from start times and durations.
    self_us = collections.Counter()
    by_thread = collections.defaultdict(list)
    for e in spans:
        if e["cat"] == "cpu_op":
            by_thread[(e["pid"], e["tid"])].append(e)
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # entries [end, name, time of children, duration]
        for e in ops:
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                stack[-1][2] += e["dur"]
            entry = [end, e["name"], 0, e["dur"]]
            stack.append(entry)
            e["_entry"] = entry
        for e in ops:
            entry = e["_entry"]
            self_us[entry[1]] += entry[3] - entry[2]
    # Wall time of a step: from the first phase's start to the last phase's end, per step.
    annotated = sorted((e for e in spans
                        if e["cat"] == "user_annotation" and e["name"].startswith("step/")),
                       key=lambda e: e["ts"])
    wall = (annotated[-1]["ts"] + annotated[-1]["dur"] - annotated[0]["ts"]) if annotated else 0
    return steps, phases, self_us, wall


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    args, phase = sys.argv[1:], None
    if args[0].startswith("--phase="):
        phase = args[0].split("=", 1)[1]
        args = args[1:]
    runs = []
    for arg in args:
        label, _, path = arg.rpartition("=")
        label = label or os.path.basename(os.path.dirname(os.path.abspath(path)))
        runs.append((label, *load(path, phase)))

    def ms(us, steps):
        return us / 1000.0 / steps

    header = "| | " + " | ".join(f"{r[0]} (ms/step)" for r in runs) + " |"
    rule = "|---|" + "---:|" * len(runs)
    print("Steps traced: " + ", ".join(f"{r[0]} {r[1]}" for r in runs))
    print("\nPhases (wall time of each step/<phase> annotation):\n")
    print(header)
    print(rule)
    names = []
    for r in runs:
        names += [n for n, _ in r[2].most_common() if n not in names]
    for n in names:
        print(f"| {n} | " + " | ".join(f"{ms(r[2].get(n, 0), r[1]):.2f}" for r in runs) + " |")
    print("| (no phase) | " + " | ".join(
        f"{ms(max(0, r[4] - sum(r[2].values())), r[1]):.2f}"
        for r in runs) + " |")
    print("| **step** | " + " | ".join(f"**{ms(r[4], r[1]):.2f}**" for r in runs) + " |")
    print("\nOperators by self time (top 25 of any run):\n")
    print(header)
    print(rule)
    top = collections.Counter()
    for r in runs:
        for n, us in r[3].items():
            top[n] = max(top[n], us / r[1])
    for n, _ in top.most_common(25):
        print(f"| {n} | " + " | ".join(f"{ms(r[3].get(n, 0), r[1]):.2f}" for r in runs) + " |")
    print("| all operators | "
          + " | ".join(f"{ms(sum(r[3].values()), r[1]):.2f}" for r in runs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
