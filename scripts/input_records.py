"""The inputs of `scripts/tokenize_text.py` as work units: pieces of text files, and records (one
JSON object a line, or one Parquet row) read from JSON Lines (plain, gzip or Zstandard) and
Parquet files, in sorted path order when the input is a folder.

    for unit in all_units(input_files(path), chunk_bytes, cut=None):   # in the main process
        for where, record in unit_records(unit): ...                    # in a worker

A unit is ("text", path, offset, data, starts_document) for a piece of a text file, or
(kind, path, first, data, progress) for records: kind "jsonl", `data` whole lines of
(decompressed) JSON Lines starting at line `first` (parsed in the worker), or kind "rows", `data`
a list of Parquet rows as dicts starting at row `first` (0-based, as pyarrow and datasets count).
`progress` is the bytes of the file on disk the unit stands for (for a progress bar over the
input's size). The same rows give the same records whatever the file's format: a JSON Lines line
is `json.loads`'d, a Parquet row is pyarrow's `to_pylist()`, so a tokenizer's output depends on
the rows alone.

Units are cut in the main process (reading, decompressing) and parsed in the workers (JSON, BPE).
A Parquet file is streamed in batches of about `chunk_bytes` of uncompressed rows, row group by
row group (pyarrow's `iter_batches`), never loaded whole; JSON Lines files are streamed by line."""
import io
import json
import os

# A folder's files read as records, by their names' ends (the rest are text files).
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
# Compressed files that are not JSON Lines: refused rather than read as text.
COMPRESSED_SUFFIXES = (".gz", ".zst")


class InputError(Exception):
    """A problem with the user's input, reported as 'tokenize_text.py: MESSAGE' and exit 2 (the
    trainer's code for a user's mistake)."""


def is_records(path):
    return path.endswith(RECORD_SUFFIXES)


def input_files(path):
    """`path` itself, or every file under the folder `path` in sorted path order, hidden ones
    skipped."""
    if os.path.isdir(path):
        files = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
        if not files:
            raise InputError(f"{path}: the folder holds no files")
        files = sorted(files)
    elif not os.path.exists(path):
        raise InputError(f"{path}: no such file or folder")
    else:
        files = [path]
    for f in files:
        if f.endswith(COMPRESSED_SUFFIXES) and not is_records(f):
            raise InputError(f"{f}: a compressed file that is not JSON Lines (tokenize_text.py "
                             f"reads {', '.join(RECORD_SUFFIXES)} and uncompressed text)")
    return files


def text_units(path, chunk_bytes, cut):
    """Pieces of about `chunk_bytes` of a text file, each ending where `cut` (a bytes regex: the
    match's end) allows, or anywhere when `cut` is None."""
    offset, data, scan = 0, bytearray(), chunk_bytes - 1
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk_bytes)
            data += block
            while data:
                if not block:
                    at = len(data)  # the end of the file
                elif len(data) < chunk_bytes:
                    break
                elif cut is None:
                    at = chunk_bytes
                else:
                    m = cut.search(data, scan)
                    if m is None:
                        scan = max(scan, len(data) - 2)  # a cut may end in the next block
                        break
                    at, scan = m.end(), chunk_bytes - 1
                yield ("text", path, offset, bytes(data[:at]), offset == 0)
                offset += at
                del data[:at]
            if not block:
                return


# --- JSON Lines, plain or compressed -----------------------------------------------------------
def _decompressed(path, raw):
    """A binary stream of the file `raw` (opened on `path`) decompressed by its name's end."""
    if path.endswith(".gz"):
        import gzip
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if path.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise InputError(f"{path}: reading .zst needs the zstandard package "
                             "(scripts/bootstrap.sh --dev installs it)") from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader, 1 << 16)
    return raw


def _read_errors():
    """The exceptions a corrupt compressed stream raises while it is read."""
    import gzip
    import zlib
    errors = [gzip.BadGzipFile, EOFError, zlib.error]
    try:
        import zstandard
        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


def jsonl_units(path, chunk_bytes):
    """Whole lines of about `chunk_bytes` of (decompressed) JSON Lines, split at b"\\n"."""
    lines, size, first, told = [], 0, 1, 0
    with open(path, "rb") as raw:
        stream = _decompressed(path, raw)
        number = 0
        try:
            for number, line in enumerate(stream, 1):
                lines.append(line)
                size += len(line)
                if size >= chunk_bytes:
                    at = raw.tell()
                    yield ("jsonl", path, first, b"".join(lines), at - told)
                    lines, size, first, told = [], 0, number + 1, at
        except _read_errors() as e:
            raise InputError(f"{path}: line {number + 1}: the compressed data is corrupt or "
                             f"truncated ({type(e).__name__}: {e})") from e
        at = raw.tell()
    if lines:
        yield ("jsonl", path, first, b"".join(lines), at - told)


# --- Parquet -------------------------------------------------------------------------------------
def _parquet_file(path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"{path}: reading Parquet needs the pyarrow package "
                         "(scripts/bootstrap.sh --dev installs it)") from None
    try:
        return pq.ParquetFile(path)
    except Exception as e:  # pyarrow.ArrowInvalid (not Parquet), OSError
        raise InputError(f"{path}: not a Parquet file that pyarrow reads ({e})") from e


def parquet_units(path, chunk_bytes, columns=None):
    """Rows of a Parquet file as dicts, in batches of about `chunk_bytes` uncompressed; only
    `columns` (all: None), each of which the file must have."""
    pf = _parquet_file(path)
    names = pf.schema_arrow.names
    missing = [c for c in columns or () if c not in names]
    if missing:
        raise InputError(f"{path}: no column '{missing[0]}' (--jsonl-field names the column of "
                         f"the text; the file's columns: {', '.join(names) or 'none'})")
    meta = pf.metadata
    rows = meta.num_rows
    if rows == 0:
        return
    uncompressed = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    batch = max(1, chunk_bytes * rows // max(1, uncompressed))
    size, first, told = os.path.getsize(path), 0, 0
    try:
        for record_batch in pf.iter_batches(batch_size=batch, columns=columns, use_threads=False):
            data = record_batch.to_pylist()
            at = size * (first + len(data)) // rows
            yield ("rows", path, first, data, at - told)
            first, told = first + len(data), at
    except InputError:
        raise
    except Exception as e:  # pyarrow's errors on a corrupt page
        raise InputError(f"{path}: row {first}: pyarrow cannot read the rows from here ({e})") \
            from e


def all_units(files, chunk_bytes, cut, whole_texts=False, columns=None):
    """The units of `files` in order: records for RECORD_SUFFIXES (Parquet: only `columns`, if
    given), text otherwise (a whole text file as one unit when `whole_texts`)."""
    for path in files:
        if path.endswith(".parquet"):
            yield from parquet_units(path, chunk_bytes, columns)
        elif is_records(path):
            yield from jsonl_units(path, chunk_bytes)
        else:
            size = os.path.getsize(path) + 1 if whole_texts else chunk_bytes
            yield from text_units(path, size, cut)


def unit_progress(unit):
    """The bytes of the input on disk that `unit` stands for."""
    return len(unit[3]) if unit[0] == "text" else unit[4]


def unit_records(unit):
    """(where, record) of each record of a records unit, `where` naming its file and line
    ('PATH:LINE') or row ('PATH: row N'); blank lines are skipped. A line that is not JSON is an
    InputError."""
    kind, path, first, data, _ = unit
    if kind == "rows":
        for number, row in enumerate(data, first):
            yield f"{path}: row {number}", row
        return
    for number, line in enumerate(data.split(b"\n"), first):  # as the file was read: by \n
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise InputError(f"{path}:{number}: not JSON ({e})") from e
        yield f"{path}:{number}", record
