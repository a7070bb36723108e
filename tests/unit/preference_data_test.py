#!/usr/bin/env python3
"""scripts/tokenize_text.py --preference, run as a user runs it: TRL's three preference forms
(conversational lists, plain strings, the implicit prompt) give, pair by pair, the sequences and
completion masks TRL's DPOTrainer counts, computed here from transformers' apply_chat_template on
the same tokenizer (a Llama-3-style template and ChatML, whose newline after <|im_end|> TRL counts
in the completion); --max-tokens with --too-long truncate (TRL's keep_start), drop and error;
shards, the validation split and the .pairs files keep pairs whole; the same rows as JSON Lines,
.jsonl.gz, .jsonl.zst and Parquet give identical shards; and bad input exits 2 naming the file
and row. Run by ctest (unit tier) with the trainer's Python."""
import json
import os
import random
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from chat_data_test import (  # noqa: E402
    CHATML,
    TEXTS,
    make_tokenizer_dir,
    read_sidecar,
    read_split,
)
from input_formats_test import files_of, write_formats  # noqa: E402
from tokenize_text_test import run  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"  # and for the script's processes
SAMPLE = os.path.join(HERE, "..", "..", "data", "chat-sample", "tokenizer")  # Llama 3's template
ANSWERS = [t for t in TEXTS if t.strip()]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def pairs(n, seed=11):
    """`n` pairs, the three forms in turn: conversational (a system message in some, earlier
    exchanges in some), plain strings, and whole conversations with an implicit prompt."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        chosen, rejected = rng.sample(ANSWERS, 2)
        prompt = [{"role": "system", "content": rng.choice(ANSWERS)}] if i % 5 == 0 else []
        for _ in range(rng.randint(0, 2)):
            prompt += [user(rng.choice(TEXTS)), assistant(rng.choice(ANSWERS))]
        prompt.append(user(rng.choice(TEXTS)))
        if i % 3 == 0:
            out.append({"prompt": prompt, "chosen": [assistant(chosen)],
                        "rejected": [assistant(rejected)], "score": i})
        elif i % 3 == 1:
            out.append({"prompt": rng.choice(TEXTS), "chosen": chosen, "rejected": rejected})
        else:
            out.append({"chosen": prompt + [assistant(chosen)],
                        "rejected": prompt + [assistant(rejected)]})
    return out


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")
    return path


# --- TRL's counting, written again from its description -------------------------------------
def trl_form(record):
    """(prompt, chosen, rejected) message lists: TRL's forms, strings as a user's and the
    assistant's messages, the implicit prompt as the messages both conversations start with."""
    if isinstance(record.get("prompt"), list):
        return record["prompt"], record["chosen"], record["rejected"]
    if isinstance(record["chosen"], str):
        return ([user(record["prompt"])], [assistant(record["chosen"])],
                [assistant(record["rejected"])])
    both = zip(record["chosen"], record["rejected"], strict=False)
    k = next(i for i, (a, b) in enumerate(both) if a != b)
    return record["chosen"][:k], record["chosen"][k:], record["rejected"][k:]


def ids_of(tok, messages, **kwargs):
    return list(tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                        **kwargs)["input_ids"])


def trl_pair(tok, record):
    """(prompt tokens, [(ids, completion mask) of chosen, of rejected]) as TRL's DPOTrainer
    makes them: prompt_ids with the generation prompt, each completion the tokens of
    prompt + completion after them."""
    prompt, chosen, rejected = trl_form(record)
    p = ids_of(tok, prompt, add_generation_prompt=True)
    out = []
    for completion in (chosen, rejected):
        ids = ids_of(tok, prompt + completion)
        assert ids[:len(p)] == p
        out.append((ids, [0] * len(p) + [1] * (len(ids) - len(p))))
    return len(p), out


# --- Reading the output, from docs/reference.md's description --------------------------------
def pairs_in(outdir, shard):
    """The count of OUTDIR/SHARD.pairs, checked against SHARD.docs: half its documents."""
    n_pairs, body = read_sidecar(os.path.join(outdir, shard + ".pairs"), b"TRAINPAR")
    documents, _ = read_sidecar(os.path.join(outdir, shard + ".docs"), b"TRAINDOC")
    assert body == b"" and documents == 2 * n_pairs, (shard, documents, n_pairs)
    return n_pairs


def read_pairs(outdir, split):
    """[((chosen ids, mask), (rejected ids, mask)), ...] of `split`: its documents (read as
    chat data's) two by two, each shard holding whole pairs."""
    shards = [n[:-4] for n in os.listdir(outdir) if n.startswith(split + "_")
              and n.endswith(".bin")]
    assert all(pairs_in(outdir, shard) > 0 for shard in shards)
    docs = read_split(outdir, split)
    return list(zip(docs[0::2], docs[1::2], strict=True))


class Preference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer
        cls.root = cls.enterClassContext(tempfile.TemporaryDirectory())
        cls.dirs = {"llama3": SAMPLE, "chatml": make_tokenizer_dir(cls.root, "chatml", CHATML)}
        cls.tok = {k: AutoTokenizer.from_pretrained(d) for k, d in cls.dirs.items()}
        cls.records = pairs(45)
        cls.jsonl = write_jsonl(os.path.join(cls.root, "pairs.jsonl"), cls.records)

    def setUp(self):
        self.dir = self.enterContext(tempfile.TemporaryDirectory())

    def tokenize(self, template, *extra, source=None, out="out", ok=True):
        return run("--preference", "--tokenizer",
                   os.path.join(self.dirs[template], "tokenizer.json"), source or self.jsonl,
                   os.path.join(self.dir, out), "--val-fraction", "0", *extra, ok=ok)

    def test_three_forms_equal_trls_sequences_and_completion_masks(self):
        for name in ("llama3", "chatml"):
            with self.subTest(template=name):
                p = self.tokenize(name, "--workers", "2", "--chunk-bytes", "900", out=name)
                got = read_pairs(os.path.join(self.dir, name), "train")
                expected = [trl_pair(self.tok[name], r)[1] for r in self.records]
                self.assertEqual(len(got), 45)
                for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                    self.assertEqual(list(g), [tuple(s) for s in e], f"pair {i}")
                targets = sum(sum(m) for pair in expected for _, m in pair)
                tokens = sum(len(ids) for pair in expected for ids, _ in pair)
                self.assertIn(f"{self.jsonl}: 45 pairs (15 conversational, 15 of strings, 15 "
                              f"with an implicit prompt), {tokens} tokens in 90 sequences of "
                              f"which {targets} completion tokens", p.stdout)
        # ChatML: the completion ends with <|im_end|> and the newline after it, as TRL counts it.
        ids, mask = got[0][0]
        end = self.tok["chatml"].convert_tokens_to_ids("<|im_end|>")
        self.assertEqual(ids[-2], end)
        self.assertEqual(self.tok["chatml"].decode(ids[-1:]), "\n")
        self.assertEqual(mask[-2:], [1, 1])

    def test_max_tokens_truncates_drops_or_refuses_as_trl_does(self):
        tok, limit = self.tok["llama3"], 40
        rendered = [trl_pair(tok, r) for r in self.records]
        p = self.tokenize("llama3", "--max-tokens", limit, out="cut")
        kept, truncated, dropped = [], 0, 0
        for prompt_len, seqs in rendered:
            if max(len(ids) for ids, _ in seqs) <= limit:
                kept.append(seqs)
            elif prompt_len >= limit:  # TRL drops a pair whose prompt alone fills max_length
                dropped += 1
            else:  # truncation_mode keep_start, each sequence on its own
                kept.append([(ids[:limit], m[:limit]) for ids, m in seqs])
                truncated += 1
        self.assertGreater(truncated, 0)
        self.assertGreater(dropped, 0)
        got = read_pairs(os.path.join(self.dir, "cut"), "train")
        self.assertEqual([list(g) for g in got], [[tuple(s) for s in e] for e in kept])
        self.assertIn(f"; {truncated} truncated, {dropped} dropped (--max-tokens {limit}, "
                      "--too-long truncate)", p.stdout)
        self.tokenize("llama3", "--max-tokens", limit, "--too-long", "drop", out="drop")
        self.assertEqual(len(read_pairs(os.path.join(self.dir, "drop"), "train")),
                         len(kept) - truncated)
        first = next(i for i, (_, seqs) in enumerate(rendered)
                     if max(len(ids) for ids, _ in seqs) > limit)
        p = self.tokenize("llama3", "--max-tokens", limit, "--too-long", "error", out="err",
                          ok=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        lengths = [len(ids) for ids, _ in rendered[first][1]]
        self.assertIn(f"{self.jsonl}:{first + 1}: a pair longer than --max-tokens {limit}: its "
                      f"chosen and rejected sequences hold {lengths[0]} and {lengths[1]} tokens",
                      p.stderr)
        self.assertNotIn("Traceback", p.stderr)

    def test_shards_and_the_validation_split_keep_pairs_whole(self):
        p = self.tokenize("chatml", "--shard-tokens", "400", "--val-fraction", "0.2", out="split")
        out = os.path.join(self.dir, "split")
        self.assertGreater(sum(n.endswith(".pairs") for n in os.listdir(out)), 3)
        train, val = read_pairs(out, "train"), read_pairs(out, "val")
        expected = [[tuple(s) for s in trl_pair(self.tok["chatml"], r)[1]] for r in self.records]
        self.assertEqual([list(g) for g in train + val], expected)
        size = [len(c[0]) + len(r[0]) for c, r in expected]
        n_val = sum(size[len(train):])
        self.assertGreaterEqual(n_val, int(sum(size) * 0.2))
        self.assertLess(n_val - size[len(train)], int(sum(size) * 0.2))  # the fewest pairs
        self.assertIn(f"{n_val} validation tokens", p.stdout)
        for name in os.listdir(out):
            if name.endswith(".bin"):
                tokens = os.path.getsize(os.path.join(out, name)) // 2
                self.assertTrue(tokens <= 400 or pairs_in(out, name[:-4]) == 1, name)
        with open(os.path.join(out, "chat.json"), encoding="utf-8") as f:
            self.assertEqual(json.load(f)["train_on"], "preference")

    def test_the_four_input_formats_give_identical_shards(self):
        # Parquet holds one type per column: a file per form. The JSON Lines of the same rows is
        # the reference.
        forms = {"conversational": self.records[0::3], "strings": self.records[1::3],
                 "implicit": self.records[2::3]}
        for form, rows in forms.items():
            with self.subTest(form=form):
                outs = {}
                for kind, path in write_formats(self.dir, form, rows).items():
                    out = f"{form}-{kind.replace('.', '-')}"
                    self.tokenize("llama3", "--workers", "2", "--chunk-bytes", "700",
                                  source=path, out=out)
                    outs[kind] = files_of(os.path.join(self.dir, out))
                for kind in ("jsonl.gz", "jsonl.zst", "parquet"):
                    self.assertEqual(outs[kind], outs["jsonl"], kind)
                expected = [[tuple(s) for s in trl_pair(self.tok["llama3"], r)[1]] for r in rows]
                got = read_pairs(os.path.join(self.dir, f"{form}-parquet"), "train")
                self.assertEqual([list(g) for g in got], expected)


class BadInput(unittest.TestCase):
    """Each stops the script with exit code 2 and a message naming the file and the row (a JSON
    Lines file's line, a Parquet file's row), before any shard is written."""

    GOOD = {"prompt": "Hi", "chosen": "Hello!", "rejected": "Go away."}

    @classmethod
    def setUpClass(cls):
        cls.root = cls.enterClassContext(tempfile.TemporaryDirectory())

    def refused(self, record, *extra, tokenizer=SAMPLE, template=None):
        path = write_jsonl(os.path.join(self.root, "bad.jsonl"),
                           [self.GOOD, self.GOOD, record, self.GOOD])
        out = os.path.join(self.root, "out")
        args = ["--preference", "--tokenizer", os.path.join(tokenizer, "tokenizer.json"), path,
                out, *extra] + (["--chat-template", template] if template else [])
        p = run(*args, ok=False)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn(f"{path}:3: ", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "train_000000.bin")))
        return p.stderr

    def test_a_missing_field(self):
        self.assertIn("no 'rejected' (a preference pair has 'chosen' and 'rejected'",
                      self.refused({"prompt": "Hi", "chosen": "Hello!"}))
        self.assertIn("the record's keys: prompt, rejected",
                      self.refused({"prompt": "Hi", "rejected": "No."}))
        self.assertIn("no 'prompt': 'chosen' and 'rejected' are strings",
                      self.refused({"chosen": "Hello!", "rejected": "No."}))
        self.assertIn("no 'rejected'", self.refused({"prompt": "Hi", "chosen": "Hello!",
                                                     "rejected": None}))
        self.assertIn("rejected[0] (assistant) has no content",
                      self.refused({"prompt": [user("Hi")], "chosen": [assistant("Hello!")],
                                    "rejected": [{"role": "assistant"}]}))

    def test_an_empty_completion(self):
        self.assertIn("an empty completion: 'chosen' holds no text",
                      self.refused({"prompt": "Hi", "chosen": "  ", "rejected": "No."}))
        self.assertIn("an empty completion: 'rejected' holds no text",
                      self.refused({"prompt": [user("Hi")], "chosen": [assistant("Hello!")],
                                    "rejected": []}))
        same = [user("Hi"), assistant("Hello!")]
        self.assertIn("an empty completion: 'chosen' holds no text after the messages it shares",
                      self.refused({"chosen": same, "rejected": same + [user("and?")]}))

    def test_forms_that_do_not_fit_together(self):
        self.assertIn("'chosen' is a str and 'rejected' a list",
                      self.refused({"prompt": "Hi", "chosen": "x", "rejected": [assistant("y")]}))
        self.assertIn("'prompt' is a list but 'chosen' and 'rejected' are strings",
                      self.refused({"prompt": [user("Hi")], "chosen": "x", "rejected": "y"}))
        self.assertIn("share no first message",
                      self.refused({"chosen": [user("a"), assistant("b")],
                                    "rejected": [user("c"), assistant("d")]}))
        self.assertIn("not JSON", self.refused('{"prompt": "Hi", '))

    def test_a_prompt_that_is_not_a_prefix_of_the_rendered_conversation(self):
        # A generation prompt that opens a thought the rendered answers do not have (as
        # reasoning models' templates do), here after the question "Think." only.
        thinking = os.path.join(self.root, "thinking.jinja")
        template = CHATML.replace(
            "'<|im_start|>assistant\n'",
            "'<|im_start|>assistant\n' + ('<think>\n' if messages[-1]['content'] == 'Think.' "
            "else '')")
        self.assertNotEqual(template, CHATML)
        with open(thinking, "w") as f:
            f.write(template)
        err = self.refused({"prompt": "Think.", "chosen": "Yes.", "rejected": "No."},
                           template=thinking)
        self.assertIn("the prompt is not a prefix of the rendered conversation", err)
        self.assertIn("and the prompt with 'chosen'", err)

    def test_a_pair_longer_than_max_tokens_under_error(self):
        long = {"prompt": "Hi", "chosen": "word " * 60, "rejected": "No."}
        self.assertIn("a pair longer than --max-tokens 30",
                      self.refused(long, "--max-tokens", "30", "--too-long", "error"))

    def test_a_bad_parquet_row_is_named_by_its_row(self):
        import pyarrow as pa
        import pyarrow.parquet as pq
        path = os.path.join(self.root, "bad.parquet")
        rows = [self.GOOD] * 5 + [{"prompt": "Hi", "chosen": "", "rejected": "No."}]
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
        p = run("--preference", "--tokenizer", os.path.join(SAMPLE, "tokenizer.json"), path,
                os.path.join(self.root, "pq"), ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{path}: row 5: an empty completion: 'chosen' holds no text", p.stderr)
        self.assertNotIn("Traceback", p.stderr)

    def test_options_that_do_not_go_with_preference(self):
        path = write_jsonl(os.path.join(self.root, "ok.jsonl"), [self.GOOD])
        tok = os.path.join(SAMPLE, "tokenizer.json")
        p = run("--preference", "--tokenizer", tok, path, os.path.join(self.root, "o"),
                "--train-on", "all", ok=False)
        self.assertIn("--train-on needs --chat (--preference trains on each pair's completions)",
                      p.stderr)
        p = run("--preference", "--chat", "--tokenizer", tok, path, os.path.join(self.root, "o"),
                ok=False)
        self.assertIn("--chat and --preference: give one", p.stderr)
        p = run("--preference", path, os.path.join(self.root, "o"), ok=False)
        self.assertIn("--preference needs --tokenizer", p.stderr)
        p = run(path, os.path.join(self.root, "o"), "--max-tokens", "5", ok=False)
        self.assertIn("--max-tokens needs --chat or --preference", p.stderr)


if __name__ == "__main__":
    unittest.main()
