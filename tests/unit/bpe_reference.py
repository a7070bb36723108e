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
<custom>.

SentencePiece-style kinds (BPE on characters, "\u2581" for a space; SPM_KINDS), one vocabulary
trained on ASCII characters only, so that the rest of the corpus (accents, CJK, emoji) is not in it:
<unk>, <s>, </s> (special), the 256 byte tokens <0x00>..<0xFF>, then the trained tokens, as Llama 2
and Mistral lay theirs out; and the normalized added token <custom>:
  spm-llama2      Llama 2's and Mistral 7B v0.1's: the normalizer Prepend("\u2581") +
                  Replace(" ", "\u2581"), no pre-tokenizer, byte_fallback and fuse_unk, the
                  decoder Replace + ByteFallback + Fuse + Strip(" ", 1, 0); merges as "a b" strings
  spm-first       newer files': the pre-tokenizer Metaspace (prepend_scheme first, split false),
                  no normalizer, the same decoder; byte_fallback, ignore_merges with a token no
                  merge reaches ("\u2581zzyzx")
  spm-always      older Metaspace files (add_prefix_space: true, i.e. prepend_scheme always, split)
                  with the Metaspace decoder; no byte fallback: a character the vocabulary lacks is
                  <unk>, one each (fuse_unk false)
  spm-never       Metaspace (prepend_scheme never, split), the decoder Replace + Fuse; no byte
                  fallback and no unknown token: such characters are dropped
  spm-gemma       Gemma's: the normalizer Replace(" ", "\u2581"), the pre-tokenizer Split(" ",
                  MergedWithPrevious) (a no-op after it), the decoder Replace + ByteFallback +
                  Fuse; then, to cut where it shows, Splits of punctuation MergedWithNext and of
                  "\u2581" MergedWithPrevious
Their expected.json entries also hold "decoded": tokenizers' decode of each document's ids
(skip_special_tokens=False), and the documents are SPM_DOCS (DOCS and one with <s> and </s>)."""
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
SPM_KINDS = ["spm-llama2", "spm-first", "spm-always", "spm-never", "spm-gemma"]
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

# Llama 2's special tokens between words, at the ends, and adjacent; spaces around them.
SPM_DOCS = DOCS + ["<s>Hello</s> <s> two  spaces </s>\n <custom>x <custom> \u2581lit\u2581eral<s>"]

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


SPACE = "\u2581"
LLAMA2_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def spm_base():
    """A SentencePiece-style BPE trained with tokenizers on TRAINING_TEXT's ASCII characters (the
    rest are not in the vocabulary), laid out as Llama 2's: <unk>, <s>, </s>, the byte tokens, then
    the trained ones."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    # ASCII only (limit_alphabet would break ties between characters in no fixed order).
    tok.train_from_iterator(["".join(c if c.isascii() else " " for c in TRAINING_TEXT)], trainer)
    j = json.loads(tok.to_str())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update((f"<0x{b:02X}>", 3 + b) for b in range(256))
    for t, _ in sorted(j["model"]["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(t, len(vocab))
    j["model"]["vocab"] = vocab
    j["added_tokens"].append({"id": len(vocab), "content": "<custom>", "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": True,
                              "special": False})
    return j


def make_spm(kind):
    """The tokenizer.json of a SentencePiece-style `kind`, as a dict."""
    j = spm_base()
    model = j["model"]
    if kind == "spm-llama2":
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]}
        j["pre_tokenizer"] = None
        j["decoder"] = LLAMA2_DECODER
        model["merges"] = [" ".join(m) for m in model["merges"]]
    elif kind == "spm-first":
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPACE,
                              "prepend_scheme": "first", "split": False}
        j["decoder"] = LLAMA2_DECODER
        model["ignore_merges"] = True
        model["vocab"][SPACE + "zzyzx"] = len(model["vocab"])
        j["added_tokens"][-1]["id"] = len(model["vocab"])  # <custom> moves up one
    elif kind == "spm-always":
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPACE, "add_prefix_space": True}
        j["decoder"] = {"type": "Metaspace", "replacement": SPACE, "add_prefix_space": True}
        model.update(byte_fallback=False, fuse_unk=False)
    elif kind == "spm-gemma":
        j["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}

        def split(pattern, behavior):
            return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": False}

        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            split({"String": " "}, "MergedWithPrevious"),
            split({"Regex": r"[.,!?;:]+"}, "MergedWithNext"),
            split({"String": SPACE}, "MergedWithPrevious")]}
        j["decoder"] = {"type": "Sequence", "decoders": LLAMA2_DECODER["decoders"][:3]}
    else:
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": SPACE,
                              "prepend_scheme": "never", "split": True}
        j["decoder"] = {"type": "Sequence", "decoders": [LLAMA2_DECODER["decoders"][0],
                                                         {"type": "Fuse"}]}
        model.update(byte_fallback=False, unk_token=None)
    return j


def write_kind(out, kind, expected):
    """Writes OUT/KIND/tokenizer.json and adds its ids (and for SentencePiece-style kinds, the
    decoded documents) to `expected`."""
    from tokenizers import Tokenizer

    spm = kind in SPM_KINDS
    path = os.path.join(out, kind, "tokenizer.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(make_spm(kind) if spm else make(kind), f, ensure_ascii=False)
    tok = Tokenizer.from_file(path)  # the file the C++ reader reads
    docs = SPM_DOCS if spm else DOCS
    ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    # (digits-prefix: the prefix spaces stay in the decoded text)
    for d, i in zip(docs, ids, strict=True) if kind in ("gpt2-pattern", "llama3-pattern") else ():
        assert tok.decode(i, skip_special_tokens=False) == d, (kind, d)
    whole = tok.encode("\n".join(docs), add_special_tokens=False).ids
    expected[kind] = {"ids": ids, "whole": whole}
    if spm:
        expected[kind]["decoded"] = [tok.decode(i, skip_special_tokens=False) for i in ids]


def main():
    out = sys.argv[1]
    expected = {"docs": DOCS, "spm_docs": SPM_DOCS}
    for kind in KINDS + SPM_KINDS:
        write_kind(out, kind, expected)
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
