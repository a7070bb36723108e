"""The Python side of the multiple-choice evaluation and bits-per-byte tests
(tests/e2e/language_models.sh, eval_tasks_*): task files, and the counts and bits per byte
computed with `transformers` from their definitions, on a model the trainer exported
(--export-hf). Offline; the tokenizer is a tokenizer.json read with `tokenizers`.

usage:
  hf_tasks.py shards DIR TOKENIZER
      DIR/train_000000.bin and DIR/val_000000.bin: uint16 ids of a text (tests/unit/
      gpt2_reference.py's CORPUS, repeated) tokenized by TOKENIZER; prints the vocabulary size.
  hf_tasks.py tasks DIR TOKENIZER N [--seed S]
      DIR/randbin.bin: N examples in llm.c's eval file format (dev/data/data_common.py,
      write_evalfile; written here from that definition) with random ids below the vocabulary;
      DIR/words.jsonl: N examples {"context", "endings", "label"} of random words.
  hf_tasks.py bad DIR VOCAB POSITIONS
      Malformed task files, one fault each: bad_magic.bin, big_id.bin, bad_label.jsonl,
      too_long.jsonl.
  hf_tasks.py score MODEL TOKENIZER SHARD CONTEXT TASK...
      Prints "NAME: acc A/N, acc_norm B/N" per TASK: acc counts the examples whose ending with
      the lowest summed next-token loss over its tokens is the label, acc_norm those with the
      lowest mean. Then "bpb X": the bits per byte over every window of CONTEXT + 1 tokens of the
      uint16 SHARD (windows at multiples of CONTEXT, the trainer's samples): the summed loss in
      nats over the targets / (ln 2 * the targets' bytes), a token's bytes being its ByteLevel
      string mapped back to bytes (GPT-2's byte-to-unicode table).
"""
import argparse
import json
import math
import os
import struct
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit"))
from gpt2_reference import CORPUS  # noqa: E402

WORDS = ("the cat sat on a mat while dogs ran far away into green hills and blue rivers "
         "under old trees beside quiet towns").split()


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


def shards(a):
    tok = Tokenizer.from_file(a.tokenizer)
    ids = encode(tok, "\n".join(CORPUS * 3))
    cut = len(ids) * 3 // 4
    np.array(ids[:cut], dtype=np.uint16).tofile(os.path.join(a.dir, "train_000000.bin"))
    np.array(ids[cut:], dtype=np.uint16).tofile(os.path.join(a.dir, "val_000000.bin"))
    print(tok.get_vocab_size())


def write_llmc(path, examples):
    """llm.c's write_evalfile: a 256-int32 header, then each example as a uint16 stream."""
    stream, longest = [], 0
    for index, (ctx, endings, label) in enumerate(examples):
        s = [65535, 0, index, label, len(endings), len(ctx), *ctx]
        for e in endings:
            s += [len(e), *e]
        s[1] = 2 * len(s)
        longest = max(longest, s[1])
        stream += s
    header = [20240522, 1, len(examples), longest] + [0] * 252
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(np.array(stream, dtype=np.uint16).tobytes())


def read_llmc(path):
    data = open(path, "rb").read()
    header = struct.unpack("<256i", data[:1024])
    s = np.frombuffer(data[1024:], dtype=np.uint16).tolist()
    examples, p = [], 0
    for _ in range(header[2]):
        assert s[p] == 65535
        label, count, n = s[p + 3], s[p + 4], s[p + 5]
        p += 6
        ctx = s[p:p + n]
        p += n
        endings = []
        for _ in range(count):
            n = s[p]
            endings.append(s[p + 1:p + 1 + n])
            p += 1 + n
        examples.append((ctx, endings, label))
    return examples


def tasks(a):
    tok = Tokenizer.from_file(a.tokenizer)
    rng = np.random.default_rng(a.seed)
    vocab = tok.get_vocab_size()
    examples = []
    for _ in range(a.n):
        ctx = rng.integers(0, vocab, rng.integers(3, 9)).tolist()
        endings = [rng.integers(0, vocab, rng.integers(1, 6)).tolist() for _ in range(4)]
        examples.append((ctx, endings, int(rng.integers(0, 4))))
    write_llmc(os.path.join(a.dir, "randbin.bin"), examples)
    with open(os.path.join(a.dir, "words.jsonl"), "w") as f:
        for _ in range(a.n):
            ctx = " ".join(rng.choice(WORDS, rng.integers(3, 7)))
            endings = [" " + " ".join(rng.choice(WORDS, rng.integers(1, 4))) for _ in range(4)]
            f.write(json.dumps({"context": ctx, "endings": endings,
                                "label": int(rng.integers(0, 4))}) + "\n")


def bad(a):
    good = ([1, 2, 3], [[4], [5, 6]], 1)
    write_llmc(os.path.join(a.dir, "bad_magic.bin"), [good])
    with open(os.path.join(a.dir, "bad_magic.bin"), "r+b") as f:
        f.write(struct.pack("<i", 20240520))  # a token shard's magic
    write_llmc(os.path.join(a.dir, "big_id.bin"), [good, ([1, 2], [[3], [a.vocab]], 0)])
    with open(os.path.join(a.dir, "bad_label.jsonl"), "w") as f:
        f.write(json.dumps({"context": "a b", "endings": [" c", " d"], "label": 0}) + "\n")
        f.write(json.dumps({"context": "a b", "endings": [" c", " d"], "label": 2}) + "\n")
    with open(os.path.join(a.dir, "too_long.jsonl"), "w") as f:
        # CJK characters the tokenizer never merged: 3 tokens each
        text = "".join(chr(0x4E00 + 7 * n) for n in range(a.positions))
        f.write(json.dumps({"context": text, "endings": [" c", " d"],
                            "label": 0}) + "\n")


def counts(model, task, tokenizer_path):
    import torch
    if task.endswith(".bin"):
        examples = read_llmc(task)
    else:
        tok = Tokenizer.from_file(tokenizer_path)
        examples = []
        for line in open(task):
            j = json.loads(line)
            examples.append((encode(tok, j["context"]), [encode(tok, e) for e in j["endings"]],
                             j["label"]))
    acc = acc_norm = 0
    with torch.no_grad():
        for ctx, endings, label in examples:
            sums, means = [], []
            for e in endings:
                seq = torch.tensor([ctx + e])
                logits = model(seq[:, :-1]).logits[0]
                losses = torch.nn.functional.cross_entropy(logits, seq[0, 1:], reduction="none")
                ending = losses[len(ctx) - 1:].double()  # the targets that are the ending's
                sums.append(ending.sum().item())
                means.append(ending.mean().item())
            acc += int(np.argmin(sums) == label)
            acc_norm += int(np.argmin(means) == label)
    name = os.path.splitext(os.path.basename(task))[0]
    print(f"{name}: acc {acc}/{len(examples)}, acc_norm {acc_norm}/{len(examples)}")


def byte_lengths(tokenizer_path):
    """Bytes per id: ByteLevel spells each byte as one character (GPT-2's bytes_to_unicode)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    extra = [b for b in range(256) if b not in printable]
    chars = {chr(b) for b in printable} | {chr(256 + n) for n in range(len(extra))}
    vocab = json.load(open(tokenizer_path))["model"]["vocab"]
    lengths = {}
    for token, i in vocab.items():
        assert all(c in chars for c in token), token
        lengths[i] = len(token)  # one character per byte
    return lengths


def bpb(model, a):
    import torch
    lengths = byte_lengths(a.tokenizer)
    tokens = torch.from_numpy(np.fromfile(a.shard, dtype=np.uint16).astype(np.int64))
    c = a.context
    windows = torch.stack([tokens[k * c:k * c + c + 1] for k in range((len(tokens) - 1) // c)])
    with torch.no_grad():
        out = model(windows[:, :-1]).logits
        nats = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                 windows[:, 1:].reshape(-1), reduction="sum")
    nbytes = sum(lengths[i] for i in windows[:, 1:].reshape(-1).tolist())
    print(f"bpb {nats.item() / (math.log(2) * nbytes):.6f} over {len(windows)} windows")


def score(a):
    # transformers is imported only here: the other commands start in a fraction of a second
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    model = GPT2LMHeadModel.from_pretrained(a.model).eval()
    for task in a.tasks:
        counts(model, task, a.tokenizer)
    bpb(model, a)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("shards")
    s.add_argument("dir")
    s.add_argument("tokenizer")
    t = sub.add_parser("tasks")
    t.add_argument("dir")
    t.add_argument("tokenizer")
    t.add_argument("n", type=int)
    t.add_argument("--seed", type=int, default=0)
    b = sub.add_parser("bad")
    b.add_argument("dir")
    b.add_argument("vocab", type=int)
    b.add_argument("positions", type=int)
    sc = sub.add_parser("score")
    sc.add_argument("model")
    sc.add_argument("tokenizer")
    sc.add_argument("shard")
    sc.add_argument("context", type=int)
    sc.add_argument("tasks", nargs="+")
    a = p.parse_args()
    {"shards": shards, "tasks": tasks, "bad": bad, "score": score}[a.command](a)


if __name__ == "__main__":
    main()
