#!/usr/bin/env python3
"""Turns a text file into token shards for the trainer's `tokens` dataset.

    scripts/tokenize_text.py my.txt data/my-tokens [--val-fraction 0.1] [--shard-tokens N] [--header none|llmc]

Byte-level: each byte of the UTF-8 text is one token (ids 0..255), so train with
`data.vocab_size: 256`. Writes OUTDIR/train_000000.bin, ... and OUTDIR/val_000000.bin: flat
little-endian uint16 tokens (nanoGPT's format), or with llm.c's 256-int32 header (--header llmc).
The last --val-fraction of the text is the validation split. (GPT-2's BPE needs its vocabulary
files, which this environment cannot download; shards made elsewhere with GPT-2 BPE, e.g. by
nanoGPT's or llm.c's preparation scripts, are read as they are, with data.vocab_size: 50257.)"""
import argparse
import os
import sys

import numpy as np

LLMC_MAGIC, LLMC_VERSION = 20240520, 1


def write_shard(path, tokens, header):
    with open(path, "wb") as f:
        if header == "llmc":
            h = np.zeros(256, dtype=np.int32)
            h[0], h[1], h[2] = LLMC_MAGIC, LLMC_VERSION, len(tokens)
            f.write(h.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input")
    p.add_argument("outdir")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per training shard")
    p.add_argument("--header", choices=["none", "llmc"], default="none")
    a = p.parse_args()
    try:
        data = open(a.input, "rb").read()
    except OSError as e:
        sys.exit(f"tokenize_text.py: {a.input}: {e.strerror}")
    if not data:
        sys.exit(f"tokenize_text.py: {a.input}: empty")
    if not 0 <= a.val_fraction < 1:
        sys.exit("tokenize_text.py: --val-fraction must be in [0, 1)")
    tokens = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
    n_val = int(len(tokens) * a.val_fraction)
    train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:]
    os.makedirs(a.outdir, exist_ok=True)
    shards = 0
    for start in range(0, len(train), a.shard_tokens):
        write_shard(os.path.join(a.outdir, f"train_{shards:06d}.bin"), train[start:start + a.shard_tokens], a.header)
        shards += 1
    if n_val:
        write_shard(os.path.join(a.outdir, "val_000000.bin"), val, a.header)
    print(f"{a.input}: {len(train)} training tokens in {shards} shard(s), {n_val} validation tokens "
          f"-> {a.outdir}; train with data.dataset: tokens, data.path: {a.outdir}, data.vocab_size: 256")


if __name__ == "__main__":
    main()
