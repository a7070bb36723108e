#!/usr/bin/env python3
"""scripts/tokenize_text.py --chat, run as a user runs it, on small tokenizers trained here
offline (nothing is downloaded): the ids of every conversation equal transformers'
apply_chat_template(..., tokenize=True) for a Llama-3-style and a ChatML template; the loss mask
equals return_assistant_tokens_mask where the template has {% generation %} markers, and a
reference of the prefix method written here where it has none; --train-on, --max-tokens and
--too-long; the mask, document and chat.json files as docs/reference.md describes them; and bad
input named by file and line. Run by ctest (unit tier) with the trainer's Python."""
import json
import os
import random
import struct
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe_reference  # noqa: E402
from tokenize_text_test import run  # noqa: E402  (runs the script as a user does)

os.environ["HF_HUB_OFFLINE"] = "1"  # and for the script's processes
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|im_start|>", "<|im_end|>"]

# Meta-Llama-3-8B-Instruct's template, as its tokenizer_config.json carries it.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}")
# The same with generation markers around what the assistant writes.
LLAMA3_MARKED = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' }}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}"
    "{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")
# ChatML (Qwen's layout), refusing roles it does not know.
CHATML = (
    "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_MARKED = (
    "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}"
    "{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEMPLATES = {"llama3": LLAMA3, "llama3-marked": LLAMA3_MARKED, "chatml": CHATML,
             "chatml-marked": CHATML_MARKED}
SPECIAL_MAP = {"llama3": ("<|begin_of_text|>", "<|eot_id|>"),
               "chatml": (None, "<|im_end|>")}

TEXTS = ["Hi", "What is the capital of France?", "Paris.", "  padded with spaces  ",
         "Line one\nLine two\n\nLine four", "", "Ünïcödé naïve café", "日本語のテキストです。",
         "emoji 👩🏾‍💻 and 🇺🇸 flags", "مرحبا بالعالم", "code: `for i in range(3): print(i)`",
         "tabs\tand\r\nCRLF", "a" * 200, "Numbers 1234567 and 3.14159", "The quick brown fox.",
         "It's what we'll do, isn't it?", " leading space", "trailing newline\n"]


def make_tokenizer_json(path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(bpe_reference.LLAMA3_PATTERN), behavior="isolated",
                             invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([bpe_reference.TRAINING_TEXT + "\n".join(TEXTS) * 3], trainer)
    tok.save(path)


def make_tokenizer_dir(root, name, template):
    """ROOT/NAME: tokenizer.json, and the template in tokenizer_config.json (llama3, chatml) or
    in chat_template.jinja (the marked ones); None: no template."""
    folder = os.path.join(root, name)
    os.makedirs(folder)
    make_tokenizer_json(os.path.join(folder, "tokenizer.json"))
    bos, eos = SPECIAL_MAP["llama3" if name.startswith("llama3") else "chatml"]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos}
    if bos:
        config["bos_token"] = bos
    if template and not name.endswith("marked"):
        config["chat_template"] = template
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    if template and name.endswith("marked"):
        with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
            f.write(template)
    return folder


def conversations(n, seed=5):
    """`n` conversations: 1 to 4 exchanges, a system message in some, empty and Unicode content,
    every fourth as prompt/completion."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 4 == 3:
            out.append({"prompt": rng.choice(TEXTS), "completion": rng.choice(TEXTS)})
            continue
        messages = [{"role": "system", "content": rng.choice(TEXTS)}] if i % 3 == 0 else []
        for _ in range(rng.randint(1, 4)):
            messages += [{"role": "user", "content": rng.choice(TEXTS)},
                         {"role": "assistant", "content": rng.choice(TEXTS)}]
        out.append({"messages": messages})
    return out


def messages_of(record):
    if "messages" in record:
        return record["messages"]
    return [{"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": record["completion"]}]


def ids_of(tok, messages, **kwargs):
    return list(tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                        **kwargs)["input_ids"])


def write_jsonl(path, records, blank_after=()):
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(records):
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")
            if i in blank_after:
                f.write("\n")


# --- Reading the output, from docs/reference.md's description --------------------------------
def read_sidecar(path, magic):
    with open(path, "rb") as f:
        raw = f.read()
    head, body = raw[:32], raw[32:]
    got_magic, version, zero, count, zero2 = struct.unpack("<8sIIQQ", head)
    assert (got_magic, version, zero, zero2) == (magic, 1, 0, 0), (path, head)
    return count, body


def read_split(outdir, split):
    """[(ids, mask), ...] of every document of `split`, checking each file's lengths."""
    docs = []
    names = sorted(n for n in os.listdir(outdir) if n.startswith(split + "_") and
                   n.endswith(".bin"))
    for name in names:
        base = os.path.join(outdir, name[:-4])
        with open(base + ".bin", "rb") as f:
            tokens = np.frombuffer(f.read(), dtype="<u2")
        n, body = read_sidecar(base + ".mask", b"TRAINMSK")
        mask = np.frombuffer(body, dtype=np.uint8)
        assert n == len(tokens) == len(mask), (name, n, len(tokens), len(mask))
        count, body = read_sidecar(base + ".docs", b"TRAINDOC")
        offsets = np.frombuffer(body, dtype="<u8")
        assert len(offsets) == count + 1 and offsets[0] == 0 and offsets[-1] == len(tokens)
        assert (np.diff(offsets.astype(np.int64)) > 0).all()
        docs += [(tokens[a:b].tolist(), mask[a:b].tolist())
                 for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return docs


# --- The prefix method, written again from its description -----------------------------------
def prefix_method_mask(tok, messages, last_only=False):
    """1 on each assistant turn's tokens: from the end of the conversation before it with the
    generation prompt to the end of the conversation through it, less whitespace after a closing
    special token. Token boundaries by encoding the text before each edge on its own."""
    full = tok.apply_chat_template(messages, tokenize=False)
    ids = tok(full, add_special_tokens=False)["input_ids"]
    specials = [t.content for t in tok.added_tokens_decoder.values() if t.special]

    def tokens_before(chars):
        before = tok(full[:chars], add_special_tokens=False)["input_ids"]
        assert ids[:len(before)] == before, "not a token boundary"
        return len(before)

    mask = [0] * len(ids)
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    for k in (turns[-1:] if last_only else turns):
        start = len(tok.apply_chat_template(messages[:k], tokenize=False,
                                            add_generation_prompt=True))
        through = tok.apply_chat_template(messages[:k + 1], tokenize=False)
        assert full.startswith(through)
        end = len(through)
        if any(through[start:].rstrip().endswith(s) for s in specials):
            end = start + len(through[start:].rstrip())
        for i in range(tokens_before(start), tokens_before(end)):
            mask[i] = 1
    return ids, mask


class Chat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer
        cls.root = cls.enterClassContext(tempfile.TemporaryDirectory())
        cls.dirs = {name: make_tokenizer_dir(cls.root, name, t) for name, t in TEMPLATES.items()}
        cls.dirs["none"] = make_tokenizer_dir(cls.root, "none", None)
        cls.tok = {name: AutoTokenizer.from_pretrained(d) for name, d in cls.dirs.items()}
        cls.records = conversations(60)
        cls.jsonl = os.path.join(cls.root, "chats.jsonl")
        write_jsonl(cls.jsonl, cls.records, blank_after={10})
        cls.runs = {}

    def setUp(self):
        self.dir = self.enterContext(tempfile.TemporaryDirectory())

    def out(self, name="out"):
        return os.path.join(self.dir, name)

    def tokenize(self, template, *extra, out="out"):
        return run("--chat", "--tokenizer", os.path.join(self.dirs[template], "tokenizer.json"),
                   self.jsonl, self.out(out), "--val-fraction", "0", *extra)

    @classmethod
    def default_run(cls, template):
        """(the output folder, stdout) of the template's run with the defaults on two processes
        in small chunks, made once for the tests that read it."""
        if template not in cls.runs:
            out = os.path.join(cls.root, "runs", template)
            p = run("--chat", "--tokenizer", os.path.join(cls.dirs[template], "tokenizer.json"),
                    cls.jsonl, out, "--val-fraction", "0", "--workers", "2", "--chunk-bytes", "700")
            cls.runs[template] = (out, p.stdout)
        return cls.runs[template]

    def test_ids_equal_apply_chat_template_and_masks_equal_the_references(self):
        for name in TEMPLATES:
            with self.subTest(template=name):
                out, stdout = self.default_run(name)
                docs = read_split(out, "train")
                self.assertEqual(len(docs), len(self.records))
                tok = self.tok[name]
                for i, (record, (ids, mask)) in enumerate(zip(self.records, docs, strict=True)):
                    messages = messages_of(record)
                    marked = name.endswith("marked")
                    expected = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                       return_assistant_tokens_mask=marked)
                    self.assertEqual(ids, list(expected["input_ids"]), f"conversation {i}")
                    if marked:
                        self.assertEqual(mask, expected["assistant_masks"], f"conversation {i}")
                    else:
                        self.assertEqual(mask, prefix_method_mask(tok, messages)[1],
                                         f"conversation {i}")
                self.assertIn(f"{self.jsonl}: 60 conversations", stdout)

    def test_the_prefix_method_agrees_with_the_markers(self):
        # The marked templates render the same text and mark the assistant's content and its
        # end-of-turn token: the prefix method on the unmarked ones finds the same tokens.
        for plain in ("llama3", "chatml"):
            with self.subTest(template=plain):
                self.assertEqual(read_split(self.default_run(plain)[0], "train"),
                                 read_split(self.default_run(plain + "-marked")[0], "train"))

    def test_train_on_last_assistant_and_all(self):
        tok = self.tok["chatml"]
        for name in ("chatml", "chatml-marked"):
            with self.subTest(template=name):
                self.tokenize(name, "--train-on", "last-assistant", out=name)
                docs = read_split(self.out(name), "train")
                for record, (_, mask) in zip(self.records, docs, strict=True):
                    self.assertEqual(mask, prefix_method_mask(tok, messages_of(record), True)[1])
        p = self.tokenize("llama3", "--train-on", "all", out="all")
        docs = read_split(self.out("all"), "train")
        self.assertTrue(all(set(mask) == {1} for _, mask in docs))
        tokens = sum(len(ids) for ids, _ in docs)
        self.assertIn(f"{tokens} tokens of which {tokens - len(docs)} targets", p.stdout)

    def test_max_tokens_truncates_at_a_turn_boundary_or_drops(self):
        tok = self.tok["llama3"]
        limit = 60
        p = self.tokenize("llama3", "--max-tokens", limit, out="cut")
        docs = read_split(self.out("cut"), "train")
        kept, truncated, dropped = [], 0, 0
        for record in self.records:
            messages = messages_of(record)
            if len(ids_of(tok, messages)) <= limit:
                kept.append(messages)
                continue
            fits = [k for k in range(len(messages) - 1, 0, -1)
                    if messages[k - 1]["role"] == "assistant"
                    and len(ids_of(tok, messages[:k])) <= limit]
            if fits:
                kept.append(messages[:fits[0]])
                truncated += 1
            else:
                dropped += 1
        self.assertGreater(truncated, 0)
        self.assertGreater(dropped, 0)
        self.assertEqual([ids for ids, _ in docs], [ids_of(tok, m) for m in kept])
        self.assertTrue(all(len(ids) <= limit for ids, _ in docs))
        self.assertIn(f"{truncated} truncated, {dropped} dropped (--max-tokens {limit}", p.stdout)
        self.tokenize("llama3", "--max-tokens", limit, "--too-long", "drop", out="drop")
        self.assertEqual(len(read_split(self.out("drop"), "train")),
                         len(kept) - truncated)

    def test_shards_end_at_documents_and_validation_holds_the_last_ones(self):
        p = self.tokenize("chatml", "--shard-tokens", "300", "--val-fraction", "0.2",
                          "--header", "llmc", out="split")
        # --header llmc: the .bin files carry llm.c's header; strip it to read them as flat.
        whole = {}
        for name in os.listdir(self.out("split")):
            if name.endswith(".bin"):
                with open(os.path.join(self.out("split"), name), "rb") as f:
                    raw = f.read()
                header = np.frombuffer(raw[:1024], dtype="<i4")
                self.assertEqual((header[0], header[1], header[2]),
                                 (20240520, 1, (len(raw) - 1024) // 2))
                with open(os.path.join(self.out("split"), name), "wb") as f:
                    f.write(raw[1024:])
                whole[name] = (len(raw) - 1024) // 2
        train, val = read_split(self.out("split"), "train"), read_split(self.out("split"), "val")
        self.assertGreater(sum(1 for n in whole if n.startswith("train")), 2)
        self.assertTrue(all(n <= 300 for n in whole.values()) or max(
            len(ids) for ids, _ in train + val) > 300)
        tok = self.tok["chatml"]
        expected = [ids_of(tok, messages_of(r)) for r in self.records]
        self.assertEqual([ids for ids, _ in train + val], expected)
        total = sum(map(len, expected))
        n_val = sum(len(ids) for ids, _ in val)
        self.assertGreaterEqual(n_val, int(total * 0.2))
        self.assertLess(n_val - len(val[0][0]), int(total * 0.2))  # the fewest that hold 20%
        self.assertIn(f"{n_val} validation tokens", p.stdout)

    def test_many_processes_equal_one(self):
        self.tokenize("llama3", "--workers", "1", out="one")
        many = self.default_run("llama3")[0]  # two processes, small chunks
        names = sorted(os.listdir(self.out("one")))
        self.assertEqual(names, sorted(os.listdir(many)))
        self.assertEqual(names, ["chat.json", "train_000000.bin", "train_000000.docs",
                                 "train_000000.mask"])
        for n in names:
            with open(os.path.join(self.out("one"), n), "rb") as a, \
                    open(os.path.join(many, n), "rb") as b:
                self.assertEqual(a.read(), b.read(), n)

    def test_chat_json_renders_a_user_turn_around_any_question(self):
        for name in ("llama3", "chatml"):
            with self.subTest(template=name):
                with open(os.path.join(self.default_run(name)[0], "chat.json"),
                          encoding="utf-8") as f:
                    prompt = json.load(f)
                tok = self.tok[name]
                encode = tok.backend_tokenizer.encode
                for question in ("What is the capital of France?", "日本語 👍🏽", "x"):
                    expected = ids_of(tok, [{"role": "user", "content": question}],
                                      add_generation_prompt=True)
                    got = (prompt["before_ids"]
                           + encode(question, add_special_tokens=False).ids + prompt["after_ids"])
                    self.assertEqual(got, expected, question)
                    self.assertEqual(prompt["before"] + question + prompt["after"],
                                     tok.apply_chat_template(
                                         [{"role": "user", "content": question}],
                                         tokenize=False, add_generation_prompt=True))
                end = SPECIAL_MAP[name][1]
                self.assertEqual(prompt["stop"], [end])
                self.assertEqual(prompt["stop_ids"], [tok.convert_tokens_to_ids(end)])
                self.assertEqual(prompt["format"], "trainer-chat-prompt")

    def test_a_template_file_replaces_a_missing_one(self):
        p = run("--chat", "--tokenizer", os.path.join(self.dirs["none"], "tokenizer.json"),
            self.jsonl, self.out("none"), ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(os.path.join(self.dirs["none"], "tokenizer.json")
                      + ": the tokenizer has no chat template", p.stderr)
        self.assertIn("--chat-template FILE", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        template = os.path.join(self.dir, "t.jinja")
        with open(template, "w") as f:
            f.write(CHATML)
        self.tokenize("none", "--chat-template", template, out="given")
        self.assertEqual(read_split(self.out("given"), "train"),
                         read_split(self.default_run("chatml")[0], "train"))


class BadInput(unittest.TestCase):
    """Each stops the script with exit code 2 (a user's mistake, as the trainer's) and a message
    naming the file and line, before anything is written."""

    @classmethod
    def setUpClass(cls):
        cls.root = cls.enterClassContext(tempfile.TemporaryDirectory())
        cls.chatml = make_tokenizer_dir(cls.root, "chatml", CHATML)

    def refused(self, line, *extra, folder=None, template=None):
        """Runs a file whose third line is `line`; returns stderr after checking the exit code
        and that the message names the file and line 3."""
        path = os.path.join(self.root, "bad.jsonl")
        good = {"messages": [{"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello"}]}
        write_jsonl(path, [good, good, line, good])
        args = ["--chat", "--tokenizer", os.path.join(folder or self.chatml, "tokenizer.json"),
                path, os.path.join(self.root, "out"), *extra]
        if template:
            args += ["--chat-template", template]
        p = run(*args, ok=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(f"{path}:3: ", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.root, "out", "train_000000.bin")))
        return p.stderr

    def test_no_assistant_turn(self):
        line = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
        self.assertIn("no assistant message (--train-on assistant", self.refused(line))
        self.assertIn("no assistant message (--train-on last-assistant",
                      self.refused(line, "--train-on", "last-assistant"))

    def test_a_role_the_template_refuses(self):
        line = {"messages": [{"role": "tool", "content": "{}"},
                             {"role": "assistant", "content": "ok"}]}
        err = self.refused(line)
        self.assertIn("the chat template refuses this conversation", err)
        self.assertIn("Unknown role: tool", err)

    def test_content_that_is_not_a_string(self):
        line = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                             {"role": "assistant", "content": "ok"}]}
        self.assertIn("message 0 (user) has content of type list: a message's content must be a "
                      "string", self.refused(line))
        line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}
        self.assertIn("message 1 (assistant) has no content", self.refused(line))
        self.assertIn("'prompt' and 'completion' must both be strings",
                      self.refused({"prompt": "q", "completion": 4}))

    def test_records_that_are_not_conversations(self):
        self.assertIn("not JSON", self.refused('{"messages": ['))
        self.assertIn("no 'messages', nor 'prompt' and 'completion' (the record's keys: text)",
                      self.refused({"text": "plain"}))
        self.assertIn("'messages' is not a non-empty list", self.refused({"messages": []}))

    def test_a_template_the_prefix_method_cannot_split(self):
        # Earlier assistant turns rendered differently from the last one (as templates that drop
        # earlier reasoning do): the whole conversation does not begin with its prefixes.
        shifty = os.path.join(self.root, "shifty.jinja")
        with open(shifty, "w") as f:
            f.write(CHATML.replace(
                "message['content'] + '<|im_end|>'",
                "(message['content'] if loop.last or message['role'] != 'assistant' else '...') "
                "+ '<|im_end|>'"))
        line = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant",
                                                                "content": "b"},
                             {"role": "user", "content": "c"}, {"role": "assistant",
                                                                "content": "d"}]}
        err = self.refused(line, template=shifty)
        self.assertIn("renders message 1 (the assistant's) inconsistently", err)
        self.assertIn("{% generation %} markers", err)
        # A header whose last character merges with the reply into one token: "ASSISTANT: " +
        # "the" is "ASSISTANT:" and " the".
        glued = os.path.join(self.root, "glued.jinja")
        with open(glued, "w") as f:
            f.write("{% for m in messages %}{{ m['role'] | upper + ': ' + m['content'] + "
                    "'<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}ASSISTANT: "
                    "{% endif %}")
        line = {"messages": [{"role": "user", "content": "a"},
                             {"role": "assistant", "content": "the end"}]}
        self.assertIn("message 1 (the assistant's) does not begin and end on token boundaries",
                      self.refused(line, template=glued))

    def test_options_that_need_chat_and_chat_that_needs_a_tokenizer(self):
        path = os.path.join(self.root, "x.jsonl")
        write_jsonl(path, [{"text": "x"}])
        p = run(path, os.path.join(self.root, "o"), "--train-on", "all", ok=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--train-on needs --chat", p.stderr)
        p = run(path, os.path.join(self.root, "o"), "--chat", ok=False)
        self.assertIn("--chat needs --tokenizer", p.stderr)
        text = os.path.join(self.root, "x.txt")
        with open(text, "w") as f:
            f.write("plain text")
        p = run(text, os.path.join(self.root, "o"), "--chat", "--tokenizer",
                os.path.join(self.chatml, "tokenizer.json"), ok=False)
        self.assertIn(f"{text}: --chat reads JSON Lines files", p.stderr)


if __name__ == "__main__":
    unittest.main()
