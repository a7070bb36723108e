#!/usr/bin/env python3
"""Writes the small samples the configs in configs/ train on, deterministically:

  data/tokens-sample/      byte-level token shards (train_000000.bin, val_000000.bin) of English
                           prose: the docstrings of Python standard-library modules, through
                           scripts/tokenize_text.py                     (configs/gpt-tiny.yaml)
  data/timeseries-sample/  series.csv: an hourly load series with daily and weekly seasons, a
                           trend, a temperature effect and noise   (configs/sequence-*.yaml)
  data/images-sample/      PNG images, by scripts/make_sample_images.py (configs/cnn-denoise.yaml)

    scripts/make_sample_data.py [--out data] [--text-bytes 400000] [--rows 8000]"""
import argparse
import csv
import importlib
import inspect
import os
import subprocess
import sys
import tempfile

import numpy as np

MODULES = ["argparse", "asyncio", "collections", "contextlib", "csv", "dataclasses", "datetime",
           "decimal", "email", "enum", "fractions", "functools", "heapq", "http.client",
           "inspect", "itertools", "json", "logging", "os", "pathlib", "pickle", "random", "re",
           "shutil", "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile",
           "textwrap", "threading", "typing", "unittest", "urllib.parse", "zipfile"]


def corpus(limit):
    parts, size = [], 0
    for name in MODULES:
        module = importlib.import_module(name)
        for _, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 300 and doc not in parts:
                parts.append(doc)
                size += len(doc)
                if size >= limit:
                    return "\n\n".join(parts)
    return "\n\n".join(parts)


def series(path, rows, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(rows)
    temperature = (12 + 8 * np.sin(2 * np.pi * (t - 2000) / (24 * 365))
                   + 5 * np.sin(2 * np.pi * (t - 15) / 24)
                   + rng.normal(0, 1.5, rows).cumsum() * 0.05)
    humidity = 60 - 0.8 * (temperature - 12) + rng.normal(0, 4, rows)
    load = (100 + 0.002 * t + 15 * np.sin(2 * np.pi * (t - 8) / 24)
            + 8 * np.sin(2 * np.pi * t / (24 * 7))
            + 1.5 * np.abs(temperature - 16) + rng.normal(0, 2.5, rows))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "temperature", "humidity", "load"])
        for i in range(rows):
            day, hour = divmod(i, 24)
            w.writerow([f"2024-{1 + (day // 28) % 12:02d}-{1 + day % 28:02d}T{hour:02d}:00",
                        f"{temperature[i]:.3f}", f"{humidity[i]:.2f}", f"{load[i]:.3f}"])


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "data")))
    p.add_argument("--text-bytes", type=int, default=400_000)
    p.add_argument("--rows", type=int, default=8000)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()

    tokens = os.path.join(a.out, "tokens-sample")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(corpus(a.text_bytes))
        text = f.name
    subprocess.run([sys.executable, os.path.join(here, "tokenize_text.py"), text, tokens],
                   check=True)
    os.unlink(text)

    os.makedirs(os.path.join(a.out, "timeseries-sample"), exist_ok=True)
    path = os.path.join(a.out, "timeseries-sample", "series.csv")
    series(path, a.rows, a.seed)
    print(f"{path}: {a.rows} hourly rows (timestamp, temperature, humidity, load)")

    images = os.path.join(here, "make_sample_images.py")
    if os.path.exists(images):
        subprocess.run([sys.executable, images, "--out", os.path.join(a.out, "images-sample")],
                       check=True)


if __name__ == "__main__":
    main()
