#!/usr/bin/env python3
"""Writes the small samples the configs in configs/ train on, deterministically:

  data/tokens-sample/      byte-level token shards (train_000000.bin, val_000000.bin) of English
                           prose: the docstrings of Python standard-library modules, through
                           scripts/tokenize_text.py                     (configs/gpt-tiny.yaml)
  data/timeseries-sample/  series.csv: an hourly load series with daily and weekly seasons, a
                           trend, a temperature effect and noise   (configs/sequence-*.yaml)
  data/images-sample/      PNG images, by scripts/make_sample_images.py (configs/cnn-denoise.yaml)
  data/chat-sample/        chat.jsonl: conversations ({"messages": [...]}, the format of
                           scripts/tokenize_text.py --chat) of questions about this project and
                           answers taken from its documentation (docs/*.md); and tokenizer/: a
                           byte-level BPE tokenizer.json trained on them (offline, `tokenizers`)
                           with Llama 3's chat template in its tokenizer_config.json
  data/preference-sample/  pairs.jsonl: preference pairs in TRL's format (scripts/tokenize_text.py
                           --preference) made from data/chat-sample/chat.jsonl: each of its first
                           conversations up to the last question, the documentation's answer
                           chosen, another conversation's answer rejected; conversational, as
                           plain strings (every fifth) and with an implicit prompt (every fifth);
                           tokenized with data/chat-sample/tokenizer

    scripts/make_sample_data.py [--out data] [--text-bytes 400000] [--rows 8000]
        [--only tokens|timeseries|images|chat|preference]"""
import argparse
import csv
import importlib
import inspect
import json
import os
import random
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ModuleNotFoundError as e:  # e.g. the system python3: run again under the project's Python
    import project_python  # beside this file: the standard library only
    project_python.reexec(__file__, e.name)

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


# --- The chat sample --------------------------------------------------------------------------
DOCS = ["README.md", "docs/reference.md", "docs/language-models.md", "docs/DESIGN.md"]
SYSTEM = ("You answer questions about trainer, a C++ data-parallel trainer on LibTorch, from its "
          "documentation.")
QUESTIONS = ["What does the documentation say about {}?", "Tell me about {}.", "Explain {}.",
             "How does trainer handle {}?", "What should I know about {}?"]
SECTION_QUESTIONS = ["What does the section \"{}\" cover?", "Summarise \"{}\" for me.",
                     "What is in \"{}\"?"]
MORE_QUESTIONS = ["What else does \"{}\" say?", "Go on about \"{}\".", "And then?"]
# Meta-Llama-3-8B-Instruct's chat template (its tokenizer_config.json).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]


def plain(markdown):
    """Markdown prose as plain text: links to their text, emphasis dropped, lines joined."""
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", markdown)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    return " ".join(line.strip() for line in text.splitlines()).strip()


def doc_answers(path):
    """(topic, answer, section, first) from a markdown file: each "**Topic.** text" paragraph or
    bullet (the topic, its text), and each prose paragraph of a section (None, the paragraph,
    whether it is the section's first)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out, section = [], None
    for block in re.split(r"\n\s*\n|\n(?=- )", text):
        block = block.strip()
        heading = re.match(r"#+ (.*)", block)
        if heading:
            section, first = heading.group(1).strip(), True
            block = block[heading.end():].strip()
            if not block:
                continue
        if not block or block.startswith("|") or section is None:
            continue
        topic = re.match(r"(?:- )?\*\*([^*]{3,80}?)\.?\*\*\.?\s*", block)
        if topic:
            answer = plain(block[topic.end():])
            if len(answer) > 40:
                out.append((plain(topic.group(1)).rstrip(".:"), answer, section, False))
        elif not block.startswith(("-", "<", "Contents")) and len(block) > 80:
            out.append((None, plain(block), section, first))
            first = False
    return out


def chat_conversations(root, seed):
    """Conversations of one to three questions about one section, a system message in every
    third; deterministic."""
    rng = random.Random(seed)
    by_section = {}
    for path in DOCS:
        for topic, answer, section, first in doc_answers(os.path.join(root, path)):
            if topic:
                question = rng.choice(QUESTIONS).format(topic[0].lower() + topic[1:])
            else:
                question = rng.choice(SECTION_QUESTIONS if first else MORE_QUESTIONS)
                question = question.format(section)
            by_section.setdefault((path, section), []).append((question, answer))
    conversations = []
    for pairs in by_section.values():
        while pairs:
            n = rng.randint(1, 3)
            take, pairs = pairs[:n], pairs[n:]
            system = len(conversations) % 3 == 0
            messages = [{"role": "system", "content": SYSTEM}] if system else []
            for question, answer in take:
                messages += [{"role": "user", "content": question},
                             {"role": "assistant", "content": answer}]
            conversations.append({"messages": messages})
    return conversations


def chat_tokenizer(folder, texts, vocab_size=2048):
    """FOLDER/tokenizer.json (a byte-level BPE trained on `texts` with Llama 3's pattern and
    special tokens) and FOLDER/tokenizer_config.json (Llama 3's chat template)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=LLAMA3_SPECIALS,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
              "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def write_chat(a):
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    folder = os.path.join(a.out, "chat-sample")
    os.makedirs(folder, exist_ok=True)
    conversations = chat_conversations(root, a.seed)
    path = os.path.join(folder, "chat.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in conversations:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    texts = [m["content"] for c in conversations for m in c["messages"]]
    chat_tokenizer(os.path.join(folder, "tokenizer"), texts)
    turns = sum(len(c["messages"]) for c in conversations)
    print(f"{path}: {len(conversations)} conversations, {turns} messages; "
          f"{folder}/tokenizer: a byte-level BPE with Llama 3's chat template")


def preference_pairs(conversations, n, seed):
    """`n` pairs from the first `n` conversations (see the module's docstring); deterministic."""
    rng = random.Random(seed)
    pairs = []
    for i, c in enumerate(conversations[:n]):
        prompt, chosen = c["messages"][:-1], c["messages"][-1]["content"]
        rejected = rng.choice([o["messages"][-1]["content"] for o in conversations
                               if o["messages"][-1]["content"] != chosen])
        if i % 5 == 3 and len(prompt) == 1:
            pairs.append({"prompt": prompt[0]["content"], "chosen": chosen, "rejected": rejected})
        elif i % 5 == 4:
            pairs.append({"chosen": prompt + [{"role": "assistant", "content": chosen}],
                          "rejected": prompt + [{"role": "assistant", "content": rejected}]})
        else:
            pairs.append({"prompt": prompt,
                          "chosen": [{"role": "assistant", "content": chosen}],
                          "rejected": [{"role": "assistant", "content": rejected}]})
    return pairs


def write_preference(a, n=40):
    chat = os.path.join(a.out, "chat-sample", "chat.jsonl")
    if not os.path.exists(chat):
        write_chat(a)
    with open(chat, encoding="utf-8") as f:
        conversations = [json.loads(line) for line in f if line.strip()]
    folder = os.path.join(a.out, "preference-sample")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "pairs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for pair in preference_pairs(conversations, n, a.seed):
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    print(f"{path}: {n} preference pairs from {chat}")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "data")))
    p.add_argument("--text-bytes", type=int, default=400_000)
    p.add_argument("--rows", type=int, default=8000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--only", choices=["tokens", "timeseries", "images", "chat", "preference"],
                   help="write this sample alone")
    a = p.parse_args()
    for name, write in (("tokens", write_tokens), ("timeseries", write_series),
                        ("images", write_images), ("chat", write_chat),
                        ("preference", write_preference)):
        if a.only in (None, name):
            write(a)


def write_tokens(a):
    here = os.path.dirname(os.path.abspath(__file__))
    tokens = os.path.join(a.out, "tokens-sample")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(corpus(a.text_bytes))
        text = f.name
    subprocess.run([sys.executable, os.path.join(here, "tokenize_text.py"), text, tokens],
                   check=True)
    os.unlink(text)


def write_series(a):
    os.makedirs(os.path.join(a.out, "timeseries-sample"), exist_ok=True)
    path = os.path.join(a.out, "timeseries-sample", "series.csv")
    series(path, a.rows, a.seed)
    print(f"{path}: {a.rows} hourly rows (timestamp, temperature, humidity, load)")


def write_images(a):
    images = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_sample_images.py")
    if os.path.exists(images):
        subprocess.run([sys.executable, images, "--out", os.path.join(a.out, "images-sample")],
                       check=True)


if __name__ == "__main__":
    main()
