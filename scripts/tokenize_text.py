#!/usr/bin/env python3
"""Turns text into token shards for the trainer's `tokens` dataset (nanoGPT's and llm.c's format).

    scripts/tokenize_text.py INPUT OUTDIR [--encoding bytes|gpt2 | --tokenizer PATH/tokenizer.json]
        [--val-fraction 0.1] [--shard-tokens N] [--header none|llmc] [--jsonl-field text]
        [--workers N] [--ranks FILE]
    scripts/tokenize_text.py --chat --tokenizer DIR/tokenizer.json INPUT OUTDIR
        [--chat-template FILE] [--train-on assistant|last-assistant|all]
        [--max-tokens N [--too-long truncate|drop|error]] [--val-fraction ...] [--shard-tokens ...]
    scripts/tokenize_text.py --preference --tokenizer DIR/tokenizer.json INPUT OUTDIR
        [--chat-template FILE] [--max-tokens N [--too-long truncate|drop|error]] [...]

INPUT is a text file (one document), a file of records, or a folder: every file under it, in
sorted path order, hidden ones skipped. Records are JSON Lines (*.jsonl, and compressed
*.jsonl.gz, *.jsonl.zst: one record per line) or Parquet (*.parquet: one record per row, streamed
a batch of rows at a time); in text mode each record's --jsonl-field string (column) is one
document. The rest are text files. The same rows give the same shards in any of these formats
(scripts/input_records.py).

Encodings:
  bytes  each byte of the UTF-8 text is one token (0..255): train with data.vocab_size: 256.
         Documents are joined by one newline (byte 10); there is no end-of-text id in 256.
  gpt2   GPT-2's BPE, the ids of tiktoken's "gpt2" encoding (encode_ordinary: "<|endoftext|>"
         inside a document is ordinary text). Each document is preceded by <|endoftext|> (50256),
         llm.c's convention. Train with data.vocab_size: 50257. The ranks are GPT-2's
         tiktoken-format file that scripts/bootstrap.sh --dev fetches: --ranks, else
         $TRAINER_GPT2_RANKS, else ${TRAINER_CACHE:-~/.cache/trainer}/gpt2.tiktoken.
  --tokenizer PATH  a BPE tokenizer.json, byte-level (GPT-2, Llama 3, SmolLM, Qwen2) or
         SentencePiece-style (Llama 2, Mistral: byte fallback, Metaspace), through the `tokenizers`
         library: Tokenizer.encode(text, add_special_tokens=False), so added tokens in the text are
         split out (no BOS is added). Each document is preceded by the added token <|endoftext|>,
         else <|end_of_text|> (none: documents are joined as they are). Above 65,536 ids (Llama
         3's 128,256) tokens are uint32, in llm.c's Llama 3 format (magic 20240801, version 7). A
         text file is tokenized whole (only JSON Lines and folders are spread over processes).
         Another model type is refused: the trainer's --generate and samples read BPE ones.

Writes OUTDIR/train_000000.bin, ... of --shard-tokens tokens each (the last one shorter) and
OUTDIR/val_000000.bin, ...: little-endian uint16 tokens, bare (nanoGPT) or after llm.c's
256-int32 header (--header llmc); uint32 tokens always carry llm.c's header. The last
--val-fraction of the token stream is the validation split (it may begin inside a document).
Shards of an earlier run in OUTDIR are removed first.

--chat: INPUT holds conversations, records of {"messages": [...]} or {"prompt": ...,
"completion": ...}, rendered with the chat template beside the tokenizer.json through
transformers (scripts/chat_template.py); each shard NAME.bin gets NAME.mask (1 on the tokens the
loss counts: the assistant's) and NAME.docs (the conversations' boundaries) beside it, shards end
at conversation boundaries, the validation split is the last whole conversations, and OUTDIR/
chat.json holds the template rendered around a placeholder user message for --generate --chat.
The formats: docs/reference.md, "Chat data".

--preference: INPUT holds preference pairs in TRL's format (scripts/preference.py): each pair's
chosen and rejected sequences (the prompt and one completion, rendered with the chat template as
TRL's DPOTrainer renders them) are two consecutive documents of one shard, NAME.mask marks their
completions, and NAME.pairs says the documents come in pairs; shards and the validation split end
at pair boundaries. The format: docs/reference.md, "Preference data".

Large inputs are cut into chunks of about 1 MiB, tokenized on --workers processes (default: every
core); the output is the same for any number of workers. GPT-2 text is cut only where the
pre-tokenizer breaks whatever follows (after an ASCII letter before a space and a letter, or after
a line break between two visible ASCII characters), so the ids equal those of the whole text."""
import argparse
import collections
import concurrent.futures
import functools
import json
import os
import re
import struct
import sys

try:
    import numpy as np
except ModuleNotFoundError as e:  # e.g. the system python3: run again under the project's Python
    import project_python  # beside this file: the standard library only
    project_python.reexec(__file__, e.name)

import chat_template  # noqa: E402  (beside this file; after numpy, which it needs)
import preference  # noqa: E402
from input_records import (  # noqa: E402
    InputError,
    all_units,
    input_files,
    is_records,
    unit_progress,
    unit_records,
)

LLMC_MAGIC, LLMC_VERSION = 20240520, 1
LLMC_MAGIC_32, LLMC_VERSION_32 = 20240801, 7  # llm.c's Llama 3 shards: uint32 tokens
LLMC_HEADER_BYTES = 256 * 4
END_OF_TEXT = 50256
# tiktoken_ext/openai_public.py's pattern for "gpt2" (tiktoken 0.14; the test checks they agree).
GPT2_PATTERN = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|"""
                r"""\s+(?!\S)|\s""")
# Where a GPT-2 text may be cut without changing its ids (see the docstring): the cut is at the
# match's end. Both sides are ASCII, so a cut never splits a UTF-8 character either.
GPT2_CUT = re.compile(rb"[A-Za-z](?= [A-Za-z])|[\x21-\x7e]\n(?=[\x21-\x7e])")


def default_ranks_path():
    if os.environ.get("TRAINER_GPT2_RANKS"):
        return os.environ["TRAINER_GPT2_RANKS"]
    cache = (os.environ.get("TRAINER_CACHE")
             or os.path.join(os.path.expanduser("~"), ".cache", "trainer"))
    return os.path.join(cache, "gpt2.tiktoken")


def gpt2_encoding(ranks_path):
    """tiktoken's gpt2 encoding, with the ranks read from `ranks_path` instead of downloaded."""
    try:
        import tiktoken
        import tiktoken.load
    except ImportError:
        raise InputError("--encoding gpt2 needs the tiktoken package (scripts/bootstrap.sh --dev "
                         "installs it into the trainer's virtualenv)") from None
    if not os.path.isfile(ranks_path):
        raise InputError(f"{ranks_path}: no GPT-2 BPE ranks there (scripts/bootstrap.sh --dev "
                         "fetches them; --ranks or TRAINER_GPT2_RANKS names another copy)")
    try:
        ranks = tiktoken.load.load_tiktoken_bpe(ranks_path)
    except Exception as e:  # tiktoken reports a malformed line with a bare ValueError
        raise InputError(f"{ranks_path}: not a tiktoken ranks file ({e})") from e
    if len(ranks) != END_OF_TEXT:
        raise InputError(f"{ranks_path}: {len(ranks)} ranks, GPT-2 has {END_OF_TEXT}")
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": END_OF_TEXT},
                             explicit_n_vocab=END_OF_TEXT + 1)


def json_tokenizer(path):
    """(the `tokenizers` Tokenizer of `path`, its vocabulary size, its document separator id or
    None)."""
    try:
        import tokenizers
    except ImportError:
        raise InputError("--tokenizer needs the tokenizers package (scripts/bootstrap.sh --dev "
                         "installs it into the trainer's virtualenv)") from None
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such tokenizer.json")
    try:
        tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:
        raise InputError(
            f"{path}: not a tokenizer.json that the tokenizers library reads ({e})") from e
    with open(path, encoding="utf-8") as f:
        kind = (json.load(f).get("model") or {}).get("type", "(no type)")
    if kind != "BPE":
        raise InputError(f"{path}: a {kind} tokenizer (model.type {kind}): the trainer reads "
                         "BPE tokenizer.json files only (byte-level: GPT-2, Llama 3, SmolLM, "
                         "Qwen2; SentencePiece-style: Llama 2, Mistral)")
    vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1
    added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
    separator = next((added[c] for c in ("<|endoftext|>", "<|end_of_text|>") if c in added), None)
    return tok, vocab_size, separator


# --- Tokenizing (in the workers) -------------------------------------------------------------
_encoding = None  # this process's: "bytes", a tiktoken.Encoding or a tokenizers.Tokenizer
_separator = END_OF_TEXT  # the id before each document (not bytes), or None
_dtype = np.uint16


def init_worker(encoding, ranks_path, tokenizer_path=None):
    global _encoding, _separator, _dtype
    if tokenizer_path:
        _encoding, vocab_size, _separator = json_tokenizer(tokenizer_path)
        _dtype = np.uint32 if vocab_size > 1 << 16 else np.uint16
    else:
        _encoding = "bytes" if encoding == "bytes" else gpt2_encoding(ranks_path)


def encode_document(text, starts_document, where):
    """The ids of `text` (str for gpt2, bytes for bytes), after <|endoftext|> for gpt2 where it
    starts a document. `where` names the text's place for a message."""
    if _encoding == "bytes":
        return np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    try:
        if hasattr(_encoding, "encode_ordinary"):
            ids = _encoding.encode_ordinary(text)
        else:
            ids = _encoding.encode(text, add_special_tokens=False).ids
    # tiktoken's Rust regex panics (a BaseException) on e.g. ~1 MB of spaces.
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise InputError(
            f"{where}: the tokenizer cannot encode these {len(text)} characters: {e}") from e
    separator = [_separator] if starts_document and _separator is not None else []
    return np.array(separator + ids, dtype=_dtype)


def record_documents(unit, field):
    """(where, text) of each record of a records unit with a non-empty text in `field`."""
    for where, record in unit_records(unit):
        text = record.get(field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            keys = (", ".join(map(str, record)) if isinstance(record, dict)
                    else type(record).__name__)
            raise InputError(f"{where}: no string field '{field}' (--jsonl-field; the "
                             f"record has: {keys})")
        if text and _encoding == "bytes":
            try:
                text = text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InputError(f"{where}: field '{field}' is not text ({e.reason})") from e
        if text:
            yield where, text


def tokenize_unit(unit, field):
    """Returns (tokens, starts_document): the unit's tokens with the separators between its own
    documents (bytes) or before each of them (gpt2), and whether it begins a document."""
    if unit[0] == "text":
        _, path, offset, data, starts = unit
        if _encoding != "bytes":
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{path}: byte {offset + e.start}: not UTF-8 text ({e.reason})") from e
        return encode_document(data, starts, f"{path} (from byte {offset})"), starts
    docs = [encode_document(text, True, where) for where, text in record_documents(unit, field)]
    if _encoding == "bytes" and len(docs) > 1:
        newline = np.array([10], dtype=np.uint16)
        docs = [d for doc in docs for d in (newline, doc)][1:]
    return (np.concatenate(docs) if docs else np.zeros(0, _dtype)), bool(docs)


# --- Output ----------------------------------------------------------------------------------
def llmc_header(count, wide):
    """llm.c's 256-int32 header of a shard of `count` tokens (uint32 ones when `wide`)."""
    h = np.zeros(256, dtype="<i4")
    h[0], h[1] = (LLMC_MAGIC_32, LLMC_VERSION_32) if wide else (LLMC_MAGIC, LLMC_VERSION)
    h[2] = count
    return h.tobytes()


class ShardWriter:
    """Streams tokens into OUTDIR/train_NNNNNN.bin of `shard_tokens` each; finish() moves the last
    `n_val` tokens into val_NNNNNN.bin shards."""

    def __init__(self, outdir, shard_tokens, header, dtype=np.uint16):
        self.outdir, self.shard_tokens, self.header = outdir, shard_tokens, header
        self.dtype = np.dtype(dtype).newbyteorder("<")  # uint32 tokens always carry llm.c's header
        self.wide = self.dtype.itemsize == 4
        if self.wide:
            self.header = "llmc"
        self.paths, self.file, self.in_file, self.total = [], None, 0, 0

    def _path(self, split, i):
        return os.path.join(self.outdir, f"{split}_{i:06d}.bin")

    def _skip(self):
        return LLMC_HEADER_BYTES if self.header == "llmc" else 0

    def _set_count(self, f, count):
        if self.header == "llmc":
            f.seek(0)
            f.write(llmc_header(count, self.wide))
            f.seek(0, os.SEEK_END)

    def _close_file(self):
        self._set_count(self.file, self.in_file)
        self.file.close()
        self.file = None

    def write(self, tokens):
        while len(tokens):
            if self.file is None:
                self.paths.append(self._path("train", len(self.paths)))
                self.file, self.in_file = open(self.paths[-1], "wb"), 0
                self._set_count(self.file, 0)
            take = min(len(tokens), self.shard_tokens - self.in_file)
            self.file.write(tokens[:take].astype(self.dtype).tobytes())
            self.in_file += take
            self.total += take
            tokens = tokens[take:]
            if self.in_file == self.shard_tokens:
                self._close_file()

    def _read(self, begin, end):
        """Tokens [begin, end) of the stream, from the train shards."""
        parts = []
        while begin < end:
            i, at = divmod(begin, self.shard_tokens)
            n = min(end - begin, self.shard_tokens - at)
            with open(self.paths[i], "rb") as f:
                f.seek(self._skip() + self.dtype.itemsize * at)
                parts.append(np.frombuffer(f.read(self.dtype.itemsize * n), dtype=self.dtype))
            begin += n
        return np.concatenate(parts)

    def finish(self, n_val):
        """Closes the stream; returns (train shards, val shards)."""
        if self.file is not None:
            self._close_file()
        train_len, vals = self.total - n_val, []
        for begin in range(train_len, self.total, self.shard_tokens):
            vals.append(self._path("val", len(vals)))
            tokens = self._read(begin, min(begin + self.shard_tokens, self.total))
            with open(vals[-1], "wb") as f:
                self._set_count(f, len(tokens))
                f.write(tokens.tobytes())
        keep = -(-train_len // self.shard_tokens)  # train shards that keep tokens
        for path in self.paths[keep:]:
            os.unlink(path)
        self.paths = self.paths[:keep]
        if n_val and keep:
            last = train_len - (keep - 1) * self.shard_tokens
            with open(self.paths[-1], "r+b") as f:
                f.truncate(self._skip() + self.dtype.itemsize * last)
                self._set_count(f, last)
        return len(self.paths), len(vals)


def remove_old_shards(outdir):
    """Removes the shards, their masks and document files, and the chat prompt of an earlier run
    (a mask left beside a new shard would not match it)."""
    old = [n for n in os.listdir(outdir) if re.fullmatch(r"(train|val)_\d{6}\.bin", n)]
    for name in os.listdir(outdir):
        if re.fullmatch(r"(train|val)_\d{6}\.(mask|docs|pairs)|chat\.json", name):
            os.unlink(os.path.join(outdir, name))
    for name in old:
        os.unlink(os.path.join(outdir, name))
    if old:
        print(f"{outdir}: removed {len(old)} shard(s) of an earlier run")


def progress_bar(total_bytes):
    """A bar over the input's bytes on inputs of 64 MiB and more (on a terminal), else None."""
    if total_bytes < 64 << 20:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        print("(no progress bar: tqdm is not installed)", file=sys.stderr)
        return None
    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", disable=None)


def run_units(units, work, take, workers, initializer, initargs, serial):
    """Calls take(unit, work(unit)) for each unit, in input order: in this process when `serial`,
    else on `workers` processes with at most 4 units per worker in flight, so memory stays bounded
    however large the input."""
    if serial:
        initializer(*initargs)
        for unit in units:
            take(unit, work(unit))
        return
    with concurrent.futures.ProcessPoolExecutor(workers, initializer=initializer,
                                                initargs=initargs) as pool:
        pending = collections.deque()
        try:
            for unit in units:
                pending.append((unit, pool.submit(work, unit)))
                if len(pending) >= 4 * workers:
                    done, future = pending.popleft()
                    take(done, future.result())
            while pending:
                done, future = pending.popleft()
                take(done, future.result())
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def tokenize(a, files):
    """Writes the shards; returns (training tokens, train shards, validation tokens, val shards)."""
    total_bytes = sum(os.path.getsize(p) for p in files)
    units = all_units(files, a.chunk_bytes, GPT2_CUT if a.encoding == "gpt2" else None,
                      whole_texts=bool(a.tokenizer), columns=[a.jsonl_field])
    dtype = np.uint32 if a.vocab_size > 1 << 16 else np.uint16
    writer = ShardWriter(a.outdir, a.shard_tokens, a.header, dtype)
    bar = progress_bar(total_bytes)
    written_docs = False

    def take(unit, result):
        nonlocal written_docs
        tokens, starts_document = result
        if a.encoding == "bytes" and starts_document and written_docs:
            writer.write(np.array([10], dtype=np.uint16))  # the newline between documents
        writer.write(tokens)
        written_docs = written_docs or starts_document
        if bar is not None:
            bar.update(unit_progress(unit))

    run_units(units, functools.partial(tokenize_unit, field=a.jsonl_field), take, a.workers,
              init_worker, (a.encoding, a.ranks, a.tokenizer),
              serial=a.workers == 1 or total_bytes <= a.chunk_bytes)
    if bar is not None:
        bar.close()
    if writer.total == 0:
        raise InputError(f"{a.input}: no text")
    n_val = int(writer.total * a.val_fraction)
    train_shards, val_shards = writer.finish(n_val)
    return writer.total - n_val, train_shards, n_val, val_shards


# --- Documents with a loss mask: conversations (--chat) and preference pairs (--preference) ----
# Beside each shard NAME.bin, --chat and --preference write NAME.mask and NAME.docs, and
# --preference NAME.pairs too (docs/reference.md, "Chat data" and "Preference data"): a 32-byte
# header (8 bytes of magic, uint32 version, uint32 0, uint64 count, uint64 0), then one byte per
# token, 0 or 1 (.mask), or the count + 1 uint64 offsets of the documents' first tokens and of the
# shard's end (.docs); .pairs is the header alone, its count the shard's pairs: documents 2p and
# 2p + 1 are pair p's chosen and rejected sequences. Shards end at document boundaries, and with
# pairs at pair boundaries.
MASK_MAGIC, DOCS_MAGIC, PAIRS_MAGIC, SIDECAR_VERSION = b"TRAINMSK", b"TRAINDOC", b"TRAINPAR", 1
_renderer = None  # this process's chat_template.Renderer
_chat_limit = (None, "truncate")  # --max-tokens, --too-long


def sidecar_header(magic, count):
    return magic + struct.pack("<IIQQ", SIDECAR_VERSION, 0, count, 0)


def init_chat_worker(tokenizer_path, template_path, train_on, max_tokens, too_long):
    global _renderer, _chat_limit
    _renderer = chat_template.Renderer(
        chat_template.load_tokenizer(tokenizer_path, template_path), train_on)
    _chat_limit = (max_tokens, too_long)


def render_conversation(record, counts):
    """(ids, mask) of one record, truncated or None (dropped) past --max-tokens; counts what it
    keeps. Raises ChatError."""
    messages = chat_template.to_messages(record)
    ids, mask = _renderer.render(messages)
    kept = len(messages)
    max_tokens, too_long = _chat_limit
    if max_tokens and len(ids) > max_tokens:
        if too_long == "error":
            raise chat_template.ChatError(
                f"a conversation of {len(ids)} tokens, longer than --max-tokens {max_tokens} "
                "(--too-long error; truncate or drop cut or skip such conversations)")
        fitted = _renderer.fit(messages, max_tokens) if too_long == "truncate" else None
        if fitted is None:
            counts["dropped"] += 1
            return None
        ids, mask, kept = fitted
        counts["truncated"] += 1
    counts["conversations"] += 1
    counts["messages"] += kept
    counts["assistant turns"] += sum(m["role"] == "assistant" for m in messages[:kept])
    counts["tokens"] += len(ids)
    counts["targets"] += int(mask[1:].sum())  # a document's first token is nobody's target
    return ids, mask


def chat_unit(unit):
    """(ids, mask, document lengths, counts) of the conversations of a records unit."""
    ids, masks, counts = [], [], collections.Counter()
    for where, record in unit_records(unit):
        try:
            rendered = render_conversation(record, counts)
        except chat_template.ChatError as e:
            raise InputError(f"{where}: {e}") from e
        if rendered is not None:
            ids.append(rendered[0])
            masks.append(rendered[1])
    lengths = [len(i) for i in ids]
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.uint8), lengths, counts
    return np.concatenate(ids), np.concatenate(masks), lengths, counts


def sample_shard_ranges(offsets, begin, end, shard_tokens):
    """Samples [begin, end) (sample s: tokens [offsets[s], offsets[s + 1])) cut into shards of
    whole samples, each of at most `shard_tokens` tokens unless one sample alone is longer:
    [(first sample, end), ...]."""
    ranges, start = [], begin
    for d in range(begin, end):
        if d > start and offsets[d + 1] - offsets[start] > shard_tokens:
            ranges.append((start, d))
            start = d
    return ranges + [(start, end)] if end > begin else ranges


def write_document_shard(base, tokens, mask, offsets, header, pairs):
    """BASE.bin, BASE.mask and BASE.docs of one shard: its tokens, their mask, and the offsets of
    its documents (offsets[0] = 0, offsets[-1] = its token count); and BASE.pairs when `pairs`."""
    count = len(tokens)
    wide = tokens.dtype.itemsize == 4
    with open(base + ".bin", "wb") as f:
        if header == "llmc" or wide:
            f.write(llmc_header(count, wide))
        f.write(tokens.tobytes())
    with open(base + ".mask", "wb") as f:
        f.write(sidecar_header(MASK_MAGIC, count))
        f.write(np.ascontiguousarray(mask, dtype=np.uint8).tobytes())
    with open(base + ".docs", "wb") as f:
        f.write(sidecar_header(DOCS_MAGIC, len(offsets) - 1))
        f.write(np.asarray(offsets, dtype="<u8").tobytes())
    if pairs:
        with open(base + ".pairs", "wb") as f:
            f.write(sidecar_header(PAIRS_MAGIC, (len(offsets) - 1) // 2))


def write_document_shards(a, tokens, mask, lengths, per_sample, noun):
    """Writes the train and val shards of the documents `lengths` describes, `per_sample` of them
    (1, or 2: a pair) kept together as one sample (the last samples holding at least
    --val-fraction of the tokens validate); returns (training tokens, train shards, validation
    tokens, val shards)."""
    docs = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    offsets = docs[::per_sample]  # the samples' first tokens and the end
    samples = len(offsets) - 1
    total, split = int(offsets[-1]), samples
    n_val = int(total * a.val_fraction)
    if n_val:
        split = int(np.searchsorted(offsets, total - n_val, side="right")) - 1
        if split == 0:
            raise InputError(f"{a.input}: {samples} {noun}: too few to hold out --val-fraction "
                             f"{a.val_fraction} of the tokens as whole {noun} (--val-fraction 0 "
                             "trains on every one)")
    shards = {"train": 0, "val": 0}
    for name, begin, end in (("train", 0, split), ("val", split, samples)):
        for first, last in sample_shard_ranges(offsets, begin, end, a.shard_tokens):
            lo, hi = int(offsets[first]), int(offsets[last])
            base = os.path.join(a.outdir, f"{name}_{shards[name]:06d}")
            write_document_shard(base, tokens[lo:hi], mask[lo:hi],
                                 docs[first * per_sample:last * per_sample + 1] - lo, a.header,
                                 per_sample == 2)
            shards[name] += 1
    train_tokens = int(offsets[split])
    return train_tokens, shards["train"], total - train_tokens, shards["val"]


def tokenize_documents(a, files, work, initializer, initargs, per_sample=1):
    """--chat and --preference: renders the records of `files` with `work` (on workers that
    `initializer` prepares) into documents with a mask, and writes the shards with their sidecars;
    returns what tokenize() does and the counts `work` made."""
    mode, noun = ("--preference", "pairs") if per_sample == 2 else ("--chat", "conversations")
    for path in files:
        if not is_records(path):
            raise InputError(f"{path}: {mode} reads JSON Lines files (*.jsonl, *.jsonl.gz, "
                             f"*.jsonl.zst) or Parquet files (*.parquet) of {noun}")
    dtype = np.dtype(np.uint32 if a.vocab_size > 1 << 16 else np.uint16).newbyteorder("<")
    paths = {k: os.path.join(a.outdir, f".documents-{k}.tmp") for k in ("tokens", "mask")}
    lengths, counts = [], collections.Counter()
    total_bytes = sum(os.path.getsize(p) for p in files)
    bar = progress_bar(total_bytes)
    try:
        with open(paths["tokens"], "wb") as tokens_file, open(paths["mask"], "wb") as mask_file:
            def take(unit, result):
                ids, mask, unit_lengths, unit_counts = result
                tokens_file.write(ids.astype(dtype).tobytes())
                mask_file.write(mask.tobytes())
                lengths.extend(unit_lengths)
                counts.update(unit_counts)
                if bar is not None:
                    bar.update(unit_progress(unit))

            run_units(all_units(files, a.chunk_bytes, None), work, take, a.workers, initializer,
                      initargs, serial=a.workers == 1 or total_bytes <= a.chunk_bytes)
        if bar is not None:
            bar.close()
        if not lengths:
            raise InputError(f"{a.input}: no {noun}"
                             + (f" ({counts['dropped']} dropped: longer than --max-tokens)"
                                if counts["dropped"] else ""))
        tokens = np.memmap(paths["tokens"], dtype=dtype, mode="r")
        mask = np.memmap(paths["mask"], dtype=np.uint8, mode="r")
        result = write_document_shards(a, tokens, mask, lengths, per_sample, noun)
        del tokens, mask
    finally:
        for path in paths.values():
            if os.path.exists(path):
                os.unlink(path)
    return result, counts


def tokenize_chat(a, files):
    """--chat: the shards of the conversations, their masks and boundaries."""
    return tokenize_documents(a, files, chat_unit, init_chat_worker,
                              (a.tokenizer, a.chat_template, a.train_on, a.max_tokens,
                               a.too_long))


def tokenize_preference(a, files):
    """--preference: the shards of the pairs, their masks, boundaries and .pairs files."""
    return tokenize_documents(a, files, preference.pair_unit, preference.init_worker,
                              (a.tokenizer, a.chat_template, a.max_tokens, a.too_long),
                              per_sample=2)


def write_chat_prompt(a, renderer):
    """OUTDIR/chat.json: what --generate --chat needs of the template (docs/reference.md)."""
    prompt = renderer.chat_prompt()
    prompt["tokenizer"] = os.path.abspath(a.tokenizer)
    prompt["template"] = os.path.abspath(a.chat_template) if a.chat_template else "the tokenizer's"
    prompt["train_on"] = "preference" if a.preference else a.train_on
    with open(os.path.join(a.outdir, "chat.json"), "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                                    for k, v in prompt.items()) + "\n}\n")


def chat_summary(a, counts):
    share = 100 * counts["targets"] / max(1, counts["tokens"])
    limit = f" (--max-tokens {a.max_tokens}, --too-long {a.too_long})" if a.max_tokens else ""
    return (f"{a.input}: {counts['conversations']} conversations, {counts['messages']} messages "
            f"({counts['assistant turns']} the assistant's), {counts['tokens']} tokens of which "
            f"{counts['targets']} targets ({share:.1f}%, --train-on {a.train_on}); "
            f"{counts['truncated']} truncated, {counts['dropped']} dropped{limit}")


def add_chat_arguments(p):
    g = p.add_argument_group("conversations and preference pairs (--chat, --preference; "
                             "docs/reference.md, \"Chat data\", \"Preference data\")")
    g.add_argument("--chat", action="store_true",
                   help="INPUT holds conversations: records of {\"messages\": [...]} or "
                   "{\"prompt\": ..., \"completion\": ...}, rendered with the chat template "
                   "beside --tokenizer; writes a loss mask and document boundaries beside the "
                   "shards, and chat.json")
    g.add_argument("--preference", action="store_true",
                   help="INPUT holds preference pairs in TRL's format: records of \"prompt\", "
                   "\"chosen\" and \"rejected\" (lists of messages or strings), or whole "
                   "conversations \"chosen\" and \"rejected\" sharing the prompt; each pair's two "
                   "sequences are kept together, with their completion masks, document "
                   "boundaries and a .pairs file beside the shards, and chat.json")
    g.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template replacing the tokenizer's")
    g.add_argument("--train-on", choices=chat_template.TRAIN_ON, default=None,
                   help="the tokens the loss counts: the assistant's turns (default), the last "
                   "assistant turn, or every token (--chat)")
    g.add_argument("--max-tokens", type=int, default=None,
                   help="conversations, or pairs with a sequence, longer than this are truncated, "
                   "dropped or refused (--too-long)")
    g.add_argument("--too-long", choices=preference.TOO_LONG, default=None,
                   help="truncate (default; --chat: the longest prefix of whole messages ending "
                   "with an assistant's that fits; --preference: each sequence's first "
                   "--max-tokens tokens, TRL's keep_start, dropping a pair whose prompt alone is "
                   "that long), drop, or error: exit 2 naming the file and row")


def check_chat_arguments(p, a):
    if a.chat and a.preference:
        p.error("--chat and --preference: give one")
    mode = "--chat" if a.chat else "--preference" if a.preference else None
    if mode is None:
        given = [f for f in ("chat_template", "train_on", "max_tokens", "too_long")
                 if getattr(a, f) is not None]
        if given:
            p.error(f"--{given[0].replace('_', '-')} needs --chat"
                    + (" or --preference" if given[0] != "train_on" else ""))
        return
    if a.preference and a.train_on is not None:
        p.error("--train-on needs --chat (--preference trains on each pair's completions)")
    if not a.tokenizer:
        p.error(f"{mode} needs --tokenizer DIR/tokenizer.json (the chat template is read beside "
                "it)")
    if a.max_tokens is not None and a.max_tokens < 1:
        p.error("--max-tokens must be positive")
    a.train_on = a.train_on or "assistant"
    a.too_long = a.too_long or "truncate"


def chat_renderer(a):
    """The main process's Renderer (it writes chat.json); a missing template or one that cannot
    render a user turn is an InputError here, before any work."""
    try:
        renderer = chat_template.Renderer(
            chat_template.load_tokenizer(a.tokenizer, a.chat_template), a.train_on)
        renderer.chat_prompt()
    except chat_template.ChatError as e:
        raise InputError(str(e)) from e
    return renderer


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="a text file, a JSON Lines (.jsonl, .jsonl.gz, .jsonl.zst) or "
                   "Parquet (.parquet) file, or a folder of them")
    p.add_argument("outdir")
    p.add_argument("--encoding", choices=["bytes", "gpt2"], default=None, help="default: bytes")
    p.add_argument("--tokenizer",
                   help="a BPE tokenizer.json (byte-level or SentencePiece-style), through the "
                        "tokenizers library")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard")
    p.add_argument("--header", choices=["none", "llmc"], default="none")
    p.add_argument("--jsonl-field", default="text",
                   help="the field of a JSON Lines record (the column of a Parquet file) "
                   "holding its text")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="processes (default: every core)")
    p.add_argument("--ranks", default=default_ranks_path(),
                   help="GPT-2's tiktoken-format ranks file")
    # Hidden: the tests cut small inputs.
    p.add_argument("--chunk-bytes", type=int, default=1 << 20, help=argparse.SUPPRESS)
    add_chat_arguments(p)
    a = p.parse_args()
    check_chat_arguments(p, a)
    if not 0 <= a.val_fraction < 1:
        p.error("--val-fraction must be in [0, 1)")
    if a.shard_tokens < 1 or a.workers < 1 or a.chunk_bytes < 1:
        p.error("--shard-tokens, --workers and --chunk-bytes must be positive")
    if a.tokenizer and a.encoding:
        p.error("--encoding and --tokenizer: give one")
    a.encoding = "tokenizer.json" if a.tokenizer else a.encoding or "bytes"
    try:
        files = input_files(a.input)
        a.vocab_size = 256 if a.encoding == "bytes" else END_OF_TEXT + 1
        if a.encoding == "gpt2":
            gpt2_encoding(a.ranks)  # a missing tiktoken or ranks file is said once, before any work
        if a.tokenizer:
            _, a.vocab_size, separator = json_tokenizer(a.tokenizer)
            if separator is None and not (a.chat or a.preference):
                print(f"{a.tokenizer}: no <|endoftext|> or <|end_of_text|> token: documents are "
                      "joined without a separator", file=sys.stderr)
        templated = a.chat or a.preference
        renderer = chat_renderer(a) if templated else None  # a template's errors, once
        os.makedirs(a.outdir, exist_ok=True)
        remove_old_shards(a.outdir)
        if templated:
            (n_train, train_shards, n_val, val_shards), counts = (
                tokenize_preference if a.preference else tokenize_chat)(a, files)
            write_chat_prompt(a, renderer)
            print(preference.summary(a.input, counts, a.max_tokens, a.too_long)
                  if a.preference else chat_summary(a, counts))
        else:
            n_train, train_shards, n_val, val_shards = tokenize(a, files)
    except InputError as e:
        print(f"tokenize_text.py: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        sys.exit(f"tokenize_text.py: {e.filename}: {e.strerror}")
    width = "uint32" if a.vocab_size > 1 << 16 else "uint16"
    tokenizer = f", data.tokenizer: {a.tokenizer}" if a.tokenizer else ""
    beside = (" (with their loss masks and document boundaries: data.packing auto packs whole "
              "conversations; chat.json for --generate --chat)" if a.chat else
              " (with their completion masks, sequence boundaries and .pairs files: each pair's "
              "chosen and rejected sequences are one sample; chat.json for --generate --chat)"
              if a.preference else "")
    print(f"{a.input}: {n_train} training tokens in {train_shards} shard(s), {n_val} validation "
          f"tokens in {val_shards} shard(s) of {width} -> {a.outdir}; train with data.dataset: "
          f"tokens, data.path: {a.outdir}, data.vocab_size: {a.vocab_size}{tokenizer}{beside}")


if __name__ == "__main__":
    main()
