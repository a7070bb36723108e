#!/usr/bin/env python3
"""Small byte-level BPE tokenizers trained with the `tokenizers` library (offline, in a second),
and the ids it gives on a corpus: the reference the C++ tokenizer.json reader is compared with
(tests/unit/tokenizer_json_test.cpp) and the tokenizers scripts/tokenize_text.py is tested with
(tests/unit/tokenize_text_test.py).

    bpe_reference.py DIR    writes DIR/KIND/tokenizer.json for each KIND of KINDS and
                            DIR/expected.json: {"docs": [...], "KIND": {"ids": [[...], ...],
                            "whole": [...]}, ...}: the ids of each document, and of all of them
                            joined by a newline (Tokenizer.encode(text, add_special_tokens=False))

Kinds:
  gpt2-pattern    the ByteLevel pre-tokenizer with its own regex (GPT-2's), merges as "a b" strings
  llama3-pattern  Llama 3's Split regex, then ByteLevel without a regex; ignore_merges, with one
                  token that no merge reaches (" zzyzx"); merges as [a, b] pairs
  digits-prefix   SmolLM's Digits (individual digits), then ByteLevel with add_prefix_space
  wide            llama3-pattern with every id moved up by 69,000 (ids 0..68,999 unused): a
                  vocabulary above 65,536, whose shards are uint32
Each has the special tokens <|endoftext|> and <|begin_of_text|> and the normalized added token
<custom>."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_reference import CORPUS  # noqa: E402

# Llama 3's pre-tokenizer pattern, as its tokenizer.json carries it.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>"]
KINDS = ["gpt2-pattern", "llama3-pattern", "digits-prefix", "wide"]
WIDE_SHIFT = 69000

DOCS = CORPUS + [
    # more scripts: Korean, Arabic, Hindi, Thai, with their own digits and punctuation
    "안녕하세요, 세계! 한국어 문장입니다. مرحبا بالعالم، هذا نص عربي ١٢٣. "
    "नमस्ते दुनिया। यह हिंदी है १२३४।",
    # emoji sequences: ZWJ, skin tones, flags, tags (England), keycaps
    "👩🏾‍💻 👨‍👨‍👧 🧑🏻‍🤝‍🧑🏿 🇺🇸🇩🇪🇧🇷 🏴󠁧󠁢󠁥󠁮󠁧󠁿 #️⃣ 🫠🫶",
    # added and special tokens inside text, adjacent, and partial ones
    "a<|endoftext|>b <|begin_of_text|> x<custom>y <|endoftext|><|endoftext|> <|endof <custom",
    # code with CRLF and tabs, Unicode spaces in a row, a token no merge reaches
    "if (x) {\r\n\treturn 1;\r\n}\r\n\u2003\u2003\u00a0 \u3000x zzyzx zzyzxs 12345678 ３４５",
]

# Without "zzyzx": no merge reaches the token llama3-pattern adds for it.
TRAINING_TEXT = "\n".join(DOCS * 3).replace("zzyzx", "") + (
    "The quick brown fox jumps over the lazy dog. It's what we'll do, isn't it? " * 20)


def make(kind):
    """The tokenizer.json of `kind`, as a dict."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "wide":
        j = make("llama3-pattern")
        j["model"]["vocab"] = {t: i + WIDE_SHIFT for t, i in j["model"]["vocab"].items()}
        for t in j["added_tokens"]:
            t["id"] += WIDE_SHIFT
        return j
    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3-pattern"))
    if kind == "gpt2-pattern":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif kind == "llama3-pattern":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TRAINING_TEXT], trainer)
    tok.add_tokens(["<custom>"])  # an added token that is not special: normalized
    j = json.loads(tok.to_str())
    if kind == "gpt2-pattern":
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]  # the older form
    if kind == "llama3-pattern":
        # A vocabulary entry after the trained ones; <custom>, not in the vocabulary, moves up one
        # (tokenizers numbers such added tokens from the vocabulary's entry count).
        vocab = j["model"]["vocab"]
        vocab["\u0120zzyzx"] = len(vocab)
        for t in j["added_tokens"]:
            if t["content"] == "<custom>":
                t["id"] = len(vocab)
    return j


def main():
    from tokenizers import Tokenizer

    out = sys.argv[1]
    expected = {"docs": DOCS}
    for kind in KINDS:
        path = os.path.join(out, kind, "tokenizer.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(make(kind), f, ensure_ascii=False)
        tok = Tokenizer.from_file(path)  # the file the C++ reader reads
        ids = [tok.encode(d, add_special_tokens=False).ids for d in DOCS]
        # (digits-prefix: the prefix spaces stay in the decoded text)
        for d, i in zip(DOCS, ids, strict=True) if kind != "digits-prefix" else ():
            assert tok.decode(i, skip_special_tokens=False) == d, (kind, d)
        whole = tok.encode("\n".join(DOCS), add_special_tokens=False).ids
        expected[kind] = {"ids": ids, "whole": whole}
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
