#!/usr/bin/env python3
"""scripts/tokenize_text.py, run as a user runs it: GPT-2 ids equal to tiktoken's on a mixed corpus
(tests/unit/gpt2_reference.py) from a text file, a folder and JSON Lines; the validation split;
fixed-size shards and llm.c's header; many processes equal one; bytes as before; and the errors.
Run by ctest (unit tier) with the trainer's Python."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "tokenize_text.py")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(SCRIPT))
import bpe_reference  # noqa: E402
import gpt2_reference  # noqa: E402
import tokenize_text  # noqa: E402

RANKS = tokenize_text.default_ranks_path()
EOT = 50256


# The script's Python: ctest's TRAINER_PYTHON goes through the tests' fork server
# (tests/hf/python_client.py), which has transformers imported already.
PYTHON = os.environ.get("TRAINER_PYTHON") or sys.executable


def run(*args, ok=True):
    p = subprocess.run([PYTHON, SCRIPT, *map(str, args)], capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise AssertionError(
            f"tokenize_text.py {' '.join(map(str, args))} failed:\n{p.stdout}{p.stderr}")
    return p


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    """Writes bytes, or a str as UTF-8 with its line ends untouched."""
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def shards(outdir, split, header="none"):
    """The tokens of OUTDIR's `split` shards in order, and each shard's length."""
    names = sorted(n for n in os.listdir(outdir) if n.startswith(split + "_"))
    parts = []
    for n in names:
        raw = read(os.path.join(outdir, n))
        if header == "llmc":
            h = np.frombuffer(raw[:1024], dtype="<i4")
            assert (h[0], h[1]) == (20240520, 1), h[:3]
            raw = raw[1024:]
            assert h[2] == len(raw) // 2, (n, h[2], len(raw))
        parts.append(np.frombuffer(raw, dtype="<u2"))
    return (np.concatenate(parts) if parts else np.zeros(0, np.uint16)), [len(p) for p in parts]


class Gpt2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.isfile(RANKS):
            raise AssertionError(
                f"{RANKS}: GPT-2's ranks are missing; scripts/bootstrap.sh --dev fetches them")
        cls.enc = gpt2_reference.reference_encoding(RANKS)
        cls.docs = gpt2_reference.CORPUS
        cls.expected = [t for d in cls.docs for t in [EOT] + cls.enc.encode_ordinary(d)]

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def write_folder(self):
        # Sorted path order is document order: 00.txt ... 07.txt, then zsub/08.txt; 03 is JSON
        # Lines.
        os.makedirs(self.path("in", "zsub"))
        for i, doc in enumerate(self.docs):
            name = ("zsub", f"{i:02d}.txt") if i == len(self.docs) - 1 else (f"{i:02d}.txt",)
            if i == 3:
                with open(self.path("in", "03.jsonl"), "w") as f:
                    f.write(json.dumps({"text": doc}) + "\n")
                continue
            write(self.path("in", *name), doc)
        write(self.path("in", ".hidden"), "not a document")
        return self.path("in")

    def test_pattern_is_tiktokens(self):
        from tiktoken_ext import openai_public
        self.assertEqual(tokenize_text.GPT2_PATTERN, openai_public.r50k_pat_str)
        self.assertEqual(self.enc._pat_str, tokenize_text.GPT2_PATTERN)

    def test_folder_equals_tiktoken_with_eot_before_each_document(self):
        run(self.write_folder(), self.path("out"), "--encoding", "gpt2", "--val-fraction", "0")
        train, _ = shards(self.path("out"), "train")
        self.assertEqual(train.tolist(), self.expected)
        self.assertFalse(os.path.exists(self.path("out", "val_000000.bin")))

    def test_jsonl_field_and_val_split(self):
        with open(self.path("docs.jsonl"), "w", encoding="utf-8") as f:
            for i, doc in enumerate(self.docs):
                f.write(json.dumps({"id": i, "content": doc}) + "\n")
                if i == 2:
                    f.write("\n" + json.dumps({"id": "empty", "content": ""}) + "\n")  # skipped
        p = run(self.path("docs.jsonl"), self.path("out"), "--encoding", "gpt2",
                "--jsonl-field", "content", "--val-fraction", "0.25", "--shard-tokens", "300",
                "--chunk-bytes", "500", "--workers", "2")
        train, train_sizes = shards(self.path("out"), "train")
        val, val_sizes = shards(self.path("out"), "val")
        n_val = int(len(self.expected) * 0.25)
        self.assertEqual(train.tolist(), self.expected[:-n_val])
        self.assertEqual(val.tolist(), self.expected[-n_val:])
        self.assertTrue(all(n == 300 for n in train_sizes[:-1]) and 0 < train_sizes[-1] <= 300,
                        train_sizes)
        self.assertTrue(all(n == 300 for n in val_sizes[:-1]), val_sizes)
        self.assertIn("data.vocab_size: 50257", p.stdout)

    def test_many_processes_equal_one_and_the_uncut_text(self):
        # One text file cut into ~64-byte chunks: the cuts must not change a single id. The code
        # without spaces gets cut at line breaks only, next to blank lines ("\n\n" is one token).
        text = "\n".join(self.docs) * 3 + "x=1;\n\ny=[2];\n\n\nz={3}\t\n\n" * 40
        write(self.path("big.txt"), text)
        common = ["--encoding", "gpt2", "--val-fraction", "0.1", "--shard-tokens", "1000",
                  "--header", "llmc", "--chunk-bytes", "64"]
        run(self.path("big.txt"), self.path("one"), *common, "--workers", "1")
        run(self.path("big.txt"), self.path("many"), *common, "--workers", "3")
        names = sorted(os.listdir(self.path("one")))
        self.assertEqual(names, sorted(os.listdir(self.path("many"))))
        self.assertGreater(len(names), 3)
        for n in names:
            self.assertEqual(read(self.path("one", n)), read(self.path("many", n)), n)
        train, _ = shards(self.path("many"), "train", "llmc")
        val, _ = shards(self.path("many"), "val", "llmc")
        self.assertEqual(train.tolist() + val.tolist(), [EOT] + self.enc.encode_ordinary(text))

    def test_missing_ranks_names_the_file(self):
        write(self.path("a.txt"), "hello")
        p = run(self.path("a.txt"), self.path("out"), "--encoding", "gpt2",
                "--ranks", self.path("none.tiktoken"), ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(self.path("none.tiktoken"), p.stderr)
        self.assertIn("scripts/bootstrap.sh", p.stderr)
        self.assertNotIn("Traceback", p.stderr)

    def test_bad_inputs_name_file_and_line(self):
        with open(self.path("bad.jsonl"), "w") as f:
            f.write('{"text": "fine"}\n{"txt": "no field"}\n')
        p = run(self.path("bad.jsonl"), self.path("out"), "--encoding", "gpt2", ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("bad.jsonl:2: no string field 'text'", p.stderr)
        with open(self.path("broken.jsonl"), "w") as f:
            f.write('{"text": "fine"}\n\n{"text": \n')
        p = run(self.path("broken.jsonl"), self.path("out"), "--encoding", "gpt2", "--workers", "2",
                ok=False)
        self.assertIn("broken.jsonl:3: not JSON", p.stderr)
        write(self.path("latin1.txt"), b"caf\xe9 au lait")
        p = run(self.path("latin1.txt"), self.path("out"), "--encoding", "gpt2", ok=False)
        self.assertIn("latin1.txt: byte 3: not UTF-8", p.stderr)
        p = run(self.path("nothing"), self.path("out"), ok=False)
        self.assertIn("nothing: no such file or folder", p.stderr)
        self.assertNotIn("Traceback", p.stderr)


def llmc_shards(outdir, split):
    """The tokens of OUTDIR's `split` shards in llm.c's Llama 3 format (uint32), checking the
    headers."""
    parts = []
    for n in sorted(n for n in os.listdir(outdir) if n.startswith(split + "_")):
        raw = read(os.path.join(outdir, n))
        h = np.frombuffer(raw[:1024], dtype="<i4")
        assert (h[0], h[1]) == (20240801, 7), h[:3]
        parts.append(np.frombuffer(raw[1024:], dtype="<u4"))
        assert h[2] == len(parts[-1]), (n, h[2], len(parts[-1]))
    return np.concatenate(parts)


class TokenizerJson(unittest.TestCase):
    """--tokenizer: a tokenizer.json through the tokenizers library (bpe_reference.py trains
    them)."""

    @classmethod
    def setUpClass(cls):
        from tokenizers import Tokenizer
        cls.tmp = tempfile.TemporaryDirectory()
        cls.ref = cls.tmp.name
        kinds = ("llama3-pattern", "wide", "spm-llama2", "spm-first")
        for kind in kinds:
            os.makedirs(os.path.join(cls.ref, kind))
            make = bpe_reference.make_spm if kind.startswith("spm-") else bpe_reference.make
            with open(os.path.join(cls.ref, kind, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(make(kind), f)
        cls.tok = {k: Tokenizer.from_file(os.path.join(cls.ref, k, "tokenizer.json"))
                   for k in kinds}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.work = tempfile.TemporaryDirectory()
        self.dir = self.work.name

    def tearDown(self):
        self.work.cleanup()

    def expected(self, kind, eot, docs=bpe_reference.DOCS):
        encode = self.tok[kind].encode
        return [t for d in docs
                for t in ([] if eot is None else [eot]) + encode(d, add_special_tokens=False).ids]

    def write_jsonl(self, docs=bpe_reference.DOCS):
        path = os.path.join(self.dir, "docs.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": doc}) + "\n" for doc in docs)
        return path

    def test_sentencepiece_style_files_equal_tokenizers(self):
        # Llama 2's normalizer and Metaspace's pre-tokenizer, byte fallback for the characters the
        # vocabulary lacks; no <|endoftext|>: the documents are joined as they are.
        for kind in ("spm-llama2", "spm-first"):
            tok = os.path.join(self.ref, kind, "tokenizer.json")
            out = os.path.join(self.dir, kind)
            p = run(self.write_jsonl(bpe_reference.SPM_DOCS), out, "--tokenizer", tok,
                    "--val-fraction", "0", "--workers", "2", "--chunk-bytes", "200")
            train, _ = shards(out, "train")
            self.assertEqual(train.tolist(), self.expected(kind, None, bpe_reference.SPM_DOCS))
            self.assertIn(f"data.tokenizer: {tok}", p.stdout)
            self.assertIn("no <|endoftext|> or <|end_of_text|> token", p.stdout + p.stderr)

    def test_small_vocabulary_is_uint16_and_equals_tokenizers(self):
        tok = os.path.join(self.ref, "llama3-pattern", "tokenizer.json")
        p = run(self.write_jsonl(), os.path.join(self.dir, "out"), "--tokenizer", tok,
                "--val-fraction", "0",
                "--workers", "2", "--chunk-bytes", "200")
        train, _ = shards(os.path.join(self.dir, "out"), "train")
        self.assertEqual(train.tolist(), self.expected("llama3-pattern", 0))
        self.assertIn(f"of uint16 -> {self.dir}/out; train with data.dataset: tokens", p.stdout)
        self.assertIn(f"data.tokenizer: {tok}", p.stdout)

    def test_wide_vocabulary_writes_uint32_with_llmcs_llama3_header(self):
        tok = os.path.join(self.ref, "wide", "tokenizer.json")
        p = run(self.write_jsonl(), os.path.join(self.dir, "out"), "--tokenizer", tok,
                "--val-fraction", "0.2",
                "--shard-tokens", "150", "--workers", "2", "--chunk-bytes", "300")
        train = llmc_shards(os.path.join(self.dir, "out"), "train")
        val = llmc_shards(os.path.join(self.dir, "out"), "val")
        expected = self.expected("wide", 69000)
        self.assertGreater(max(expected), 65535)
        self.assertEqual(train.tolist() + val.tolist(), expected)
        self.assertIn("of uint32", p.stdout)
        vocab_size = max(self.tok["wide"].get_vocab(with_added_tokens=True).values()) + 1
        self.assertGreater(vocab_size, 1 << 16)
        self.assertIn(f"data.vocab_size: {vocab_size},", p.stdout)

    def test_other_kinds_and_missing_files_are_named(self):
        write(os.path.join(self.dir, "a.txt"), "hello")
        wp = os.path.join(self.dir, "wordpiece.json")
        from tokenizers import Tokenizer, models
        Tokenizer(models.WordPiece({"[UNK]": 0, "hello": 1}, unk_token="[UNK]")).save(wp)
        text, out = os.path.join(self.dir, "a.txt"), os.path.join(self.dir, "out")
        p = run(text, out, "--tokenizer", wp, ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{wp}: a WordPiece tokenizer (model.type WordPiece)", p.stderr)
        p = run(text, out, "--tokenizer", wp + ".no", ok=False)
        self.assertIn(f"{wp}.no: no such tokenizer.json", p.stderr)
        self.assertNotIn("Traceback", p.stderr)


class Bytes(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_one_file_is_its_bytes_and_documents_are_joined_by_a_newline(self):
        data = "héllo\n\t wörld  \n".encode() * 50
        write(os.path.join(self.dir, "a.txt"), data)
        run(os.path.join(self.dir, "a.txt"), os.path.join(self.dir, "one"), "--val-fraction", "0.2",
            "--chunk-bytes", "7", "--workers", "2")
        train, _ = shards(os.path.join(self.dir, "one"), "train")
        val, _ = shards(os.path.join(self.dir, "one"), "val")
        self.assertEqual(bytes(train.astype(np.uint8)) + bytes(val.astype(np.uint8)), data)
        self.assertEqual(len(val), int(len(data) * 0.2))

        with open(os.path.join(self.dir, "d.jsonl"), "w") as f:
            f.write('{"text": "one"}\n{"text": "two\\n"}\n{"text": ""}\n{"text": "thrée"}\n')
        run(os.path.join(self.dir, "d.jsonl"), os.path.join(self.dir, "j"), "--val-fraction", "0")
        train, _ = shards(os.path.join(self.dir, "j"), "train")
        self.assertEqual(bytes(train.astype(np.uint8)), "one\ntwo\n\nthrée".encode())


if __name__ == "__main__":
    unittest.main()
