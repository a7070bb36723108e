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
  - on a GPU (traces with CUDA activity): the GPU's busy time (the union of its kernels' and
    copies' intervals) against the traced wall time, and the kernels with the most time, so that
    launch gaps and unfused kernels show against a peer's (torch.compile's).
Steps are counted by their "step/optimizer" annotations. --phase=forward (backward, ...) sums
the operators inside that phase only."""
import collections
import json
import os
import sys


def gpu_time(events):
    """(busy us, {kernel name: us}) of the GPU events ("kernel", "gpu_memcpy", "gpu_memset")."""
    gpu = [e for e in events
           if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    kernels = collections.Counter()
    for e in gpu:
        name = e["name"] if len(e["name"]) <= 90 else e["name"][:87] + "..."
        kernels[name] += e["dur"]
    busy, end = 0, None  # the union of the intervals
    for e in sorted(gpu, key=lambda e: e["ts"]):
        start, stop = e["ts"], e["ts"] + e["dur"]
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return busy, kernels


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
    return steps, phases, self_us, wall, *gpu_time(events)


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
    def top_table(title, field, total, quote=""):
        """The 25 names of runs' counter `field` with the most time per step in any run."""
        print(f"\n{title} (top 25 of any run):\n")
        print(header)
        print(rule)
        top = collections.Counter()
        for r in runs:
            for n, us in r[field].items():
                top[n] = max(top[n], us / r[1])
        for n, _ in top.most_common(25):
            print(f"| {quote}{n}{quote} | "
                  + " | ".join(f"{ms(r[field].get(n, 0), r[1]):.2f}" for r in runs) + " |")
        print(f"| {total} | "
              + " | ".join(f"{ms(sum(r[field].values()), r[1]):.2f}" for r in runs) + " |")

    top_table("Operators by self time", 3, "all operators")
    if not any(r[6] for r in runs):
        return 0
    print("\nGPU (kernels, copies and memsets; busy = the union of their intervals):\n")
    print(header)
    print(rule)
    print("| GPU busy | " + " | ".join(f"{ms(r[5], r[1]):.2f}" for r in runs) + " |")
    print("| GPU idle in the step | " + " | ".join(
        f"{ms(max(0, r[4] - r[5]), r[1]):.2f}" for r in runs) + " |")
    top_table("Kernels by time", 6, "all kernels", quote="`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
