#!/usr/bin/env python3
"""scripts/tokenize_text.py's inputs as they come: the same rows as plain JSON Lines, .jsonl.gz,
.jsonl.zst (two frames) and Parquet (several row groups), and a folder mixing them, give byte for
byte the same shards in text mode (bytes and a tokenizer.json, --jsonl-field naming the column)
and in --chat mode (--preference: preference_data_test.py); Parquet is read a batch of rows at a
time; and a corrupt or mismatched file exits 2 naming the file and the line or row. Run by ctest
(unit tier) with the trainer's Python."""
import gzip
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import bpe_reference  # noqa: E402
import input_records  # noqa: E402
from chat_data_test import conversations  # noqa: E402
from tokenize_text_test import run  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE = os.path.join(HERE, "..", "..", "data", "chat-sample", "tokenizer", "tokenizer.json")


def write_formats(folder, name, rows):
    """FOLDER/NAME.jsonl, .jsonl.gz, .jsonl.zst and .parquet of the same rows: {kind: path}."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    paths = {k: os.path.join(folder, f"{name}.{k}")
             for k in ("jsonl", "jsonl.gz", "jsonl.zst", "parquet")}
    with open(paths["jsonl"], "wb") as f:
        f.write(text)
    with open(paths["jsonl.gz"], "wb") as f:
        f.write(gzip.compress(text))
    half = text.index(b"\n", len(text) // 2) + 1
    with open(paths["jsonl.zst"], "wb") as f:
        c = zstandard.ZstdCompressor()
        f.write(c.compress(text[:half]) + c.compress(text[half:]))
    # Every row's keys make the columns (from_pylist would take the first row's alone).
    table = pa.Table.from_struct_array(pa.array(rows))
    pq.write_table(table, paths["parquet"], row_group_size=3)
    return paths


def files_of(outdir):
    out = {}
    for n in sorted(os.listdir(outdir)):
        with open(os.path.join(outdir, n), "rb") as f:
            out[n] = f.read()
    return out


class SameShards(unittest.TestCase):
    def setUp(self):
        self.dir = self.enterContext(tempfile.TemporaryDirectory())

    def assert_same(self, paths, *args):
        """Runs each input with `args`; every output equals the plain JSON Lines one."""
        outs = {}
        for kind, path in paths.items():
            out = os.path.join(self.dir, "out-" + kind.replace(".", "-"))
            run(path, out, "--workers", "2", "--chunk-bytes", "300", *args)
            outs[kind] = files_of(out)
        self.assertGreater(sum(len(v) for v in outs["jsonl"].values()), 1000)
        for kind, files in outs.items():
            self.assertEqual(files, outs["jsonl"], kind)

    def text_rows(self):
        docs = bpe_reference.DOCS * 2
        return [{"id": i, "body": d, "lang": "en"} for i, d in enumerate(docs)]

    def test_text_bytes_and_tokenizer_with_a_named_column(self):
        paths = write_formats(self.dir, "docs", self.text_rows())
        for encoding in (["--encoding", "bytes"], ["--tokenizer", SAMPLE]):
            with self.subTest(encoding=encoding[0]):
                self.assert_same(paths, *encoding, "--jsonl-field", "body", "--val-fraction",
                                 "0.1", "--shard-tokens", "700")

    def test_a_folder_mixing_the_formats_equals_one_file(self):
        rows = self.text_rows()
        parts = [rows[:7], rows[7:15], rows[15:]]
        folder = os.path.join(self.dir, "mixed")
        os.makedirs(folder)
        kinds = ("jsonl.gz", "parquet", "jsonl.zst")  # a_*, b_*, c_*: this order
        for i, (part, kind) in enumerate(zip(parts, kinds, strict=True)):
            written = write_formats(self.dir, f"{'abc'[i]}_part", part)
            os.rename(written[kind], os.path.join(folder, os.path.basename(written[kind])))
        whole = write_formats(self.dir, "whole", rows)["jsonl"]
        self.assert_same({"jsonl": whole, "folder": folder}, "--tokenizer", SAMPLE,
                         "--jsonl-field", "body", "--val-fraction", "0")

    def test_chat_conversations(self):
        # Messages and prompt/completion rows together: in Parquet the columns a row lacks are
        # null, which reads as absent.
        paths = write_formats(self.dir, "chats", conversations(24))
        self.assert_same(paths, "--chat", "--tokenizer", SAMPLE, "--val-fraction", "0.2")


class Streaming(unittest.TestCase):
    def test_parquet_is_read_a_batch_of_rows_at_a_time(self):
        import pyarrow as pa
        import pyarrow.parquet as pq
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "big.parquet")
            rows = [{"text": f"document {i} " * 20, "n": i} for i in range(200)]
            pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=50)
            units = list(input_records.parquet_units(path, 2000, ["text"]))
            self.assertGreater(len(units), 10)
            self.assertTrue(all(len(u[3]) <= 50 for u in units))
            self.assertEqual([r for u in units for r in u[3]], [{"text": r["text"]} for r in rows])
            self.assertEqual([u[2] for u in units],
                             [sum(len(v[3]) for v in units[:i]) for i in range(len(units))])
            self.assertEqual(sum(input_records.unit_progress(u) for u in units),
                             os.path.getsize(path))


class BadFiles(unittest.TestCase):
    """Each exits 2 naming the file (and the line or row), without a traceback."""

    def setUp(self):
        self.dir = self.enterContext(tempfile.TemporaryDirectory())

    def refused(self, path, *args):
        p = run(path, os.path.join(self.dir, "out"), *args, ok=False)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        return p.stderr

    def test_truncated_compressed_json_lines(self):
        text = "".join(json.dumps({"text": f"line {i} " * 30}) + "\n" for i in range(400))
        data = gzip.compress(text.encode())
        path = os.path.join(self.dir, "cut.jsonl.gz")
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
        self.assertIn(f"{path}: line ", self.refused(path))
        self.assertIn("the compressed data is corrupt or truncated", self.refused(path))
        path = os.path.join(self.dir, "junk.jsonl.zst")
        with open(path, "wb") as f:
            f.write(b"not zstd at all\n" * 10)
        self.assertIn(f"{path}: line 1: the compressed data is corrupt", self.refused(path))

    def test_parquet_without_the_column_or_with_a_null_text(self):
        import pyarrow as pa
        import pyarrow.parquet as pq
        path = os.path.join(self.dir, "docs.parquet")
        pq.write_table(pa.Table.from_pylist([{"body": "a"}, {"body": "b"}]), path)
        self.assertIn(f"{path}: no column 'text' (--jsonl-field names the column of the text; "
                      "the file's columns: body)", self.refused(path))
        pq.write_table(pa.Table.from_pylist([{"text": "a"}, {"text": "b"}, {"text": None}]),
                       path)
        self.assertIn(f"{path}: row 2: no string field 'text'", self.refused(path))
        with open(path, "wb") as f:
            f.write(b"PAR1 but not really")
        self.assertIn(f"{path}: not a Parquet file that pyarrow reads", self.refused(path))

    def test_a_compressed_file_that_is_not_json_lines(self):
        folder = os.path.join(self.dir, "in")
        os.makedirs(folder)
        with open(os.path.join(folder, "a.txt"), "w") as f:
            f.write("text")
        with open(os.path.join(folder, "b.txt.gz"), "wb") as f:
            f.write(gzip.compress(b"text"))
        self.assertIn(f"{folder}/b.txt.gz: a compressed file that is not JSON Lines",
                      self.refused(folder))
        self.assertIn("--chat reads JSON Lines files (*.jsonl, *.jsonl.gz, *.jsonl.zst) or "
                      "Parquet files", self.refused(os.path.join(folder, "a.txt"), "--chat",
                                                    "--tokenizer", SAMPLE))


if __name__ == "__main__":
    unittest.main()
