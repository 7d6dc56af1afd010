"""What each file of a corpus holds, by its name: plain text, JSON Lines records or Parquet rows;
and which "text" files are not text at all.

Formats (by extension, so a folder may mix them):
- `.jsonl`, `.ndjson` (and `.gz` of either): one JSON object a line; only its text field (default
  "text") is trained on, never the keys or other fields. Blank lines are skipped.
- `.parquet`: only the text column (a string column, default "text"), streamed a batch of rows at a
  time with pyarrow (`pip install 'swarmloco[parquet]'`); nothing is downloaded.
- anything else: a text file, read as bytes.
A record (a line, a row) whose text is null or "" is skipped and counted; a malformed record (bad
JSON, not an object, no text field, a text that is not a string) is an error naming the file and
line or row, since it means the file is not what the run thinks it is.

Not text. A text file whose first SAMPLE_BYTES hold NUL bytes (more than NUL_LIMIT of them) or more
than NOT_TEXT_LIMIT bytes that are not UTF-8 text (invalid sequences, control characters) is a binary
file: training on it teaches noise (loss near ln 256). A single such --data file is refused; in a
folder it is skipped with a warning, and a folder where nothing is left is refused. The limits leave
legacy 8-bit text in (the stdlib's own KOI8-R test module is 42% non-UTF-8 and stays in the
default corpus); only a file's head is looked at, so the check costs no second pass over a corpus.
"""

from __future__ import annotations

import gzip
import json
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from peer.learn.corpus import CorpusError

log = logging.getLogger("swarmloco.data")

DEFAULT_TEXT_FIELD = "text"
SAMPLE_BYTES = 64 << 10  # head of a text file that decides whether it is text
NOT_TEXT_LIMIT = 0.5  # share of the head that may be invalid UTF-8 or control bytes
NUL_LIMIT = 0.001  # share of the head that may be NUL bytes (a stray one is fine; UTF-16, ELF, random are not)
PARQUET_BATCH_ROWS = 1024
WHAT_TO_DO = "point --data at text, .jsonl or .parquet files"

Format = Literal["text", "jsonl", "parquet"]
_JSONL = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
# Control bytes that are not whitespace (tab, LF, VT, FF, CR) or ESC (ANSI colours in logs), and DEL.
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27)) + b"\x7f"


def file_format(path: Path) -> Format:
    name = path.name.lower()
    if name.endswith(_JSONL):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


# --- records ---------------------------------------------------------------------------------


def records(path: Path, text_field: str) -> Iterator[tuple[int, bytes]]:
    """(key, UTF-8 text) of each record of a .jsonl or .parquet file, b"" for a null or empty text.
    key: the 1-based line of a .jsonl file, the 0-based row of a .parquet file."""
    return _jsonl_records(path, text_field) if file_format(path) == "jsonl" else _parquet_records(path, text_field)


def record_key(relative_path: str, key: int) -> str:
    """What a record's split is hashed from (peer/learn/data.py's is_validation_file)."""
    return f"{relative_path}#{key}"


def _jsonl_records(path: Path, text_field: str) -> Iterator[tuple[int, bytes]]:
    if not path.name.lower().endswith(".gz"):
        with open(path, "rb") as handle:
            yield from _jsonl_lines(path, handle, text_field)
        return
    with gzip.open(path, "rb") as handle:
        try:
            yield from _jsonl_lines(path, handle, text_field)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise CorpusError(f"{path}: not a whole gzip file ({exc}); copy it again, or rename it without .gz "
                              "if it is not compressed") from None


def _jsonl_lines(path: Path, handle, text_field: str) -> Iterator[tuple[int, bytes]]:
    for line_no, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        where = f"{path} line {line_no}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{where}: not valid JSON ({exc.msg}, column {exc.colno}); fix or delete that line "
                              "(each line of a .jsonl file is one JSON object)") from None
        except UnicodeDecodeError:
            raise CorpusError(f"{where}: not UTF-8; convert the file to UTF-8 (e.g. iconv -t utf-8)") from None
        if not isinstance(record, dict):
            raise CorpusError(f"{where}: a JSON {type(record).__name__}, not an object with a {text_field!r} field; "
                              "write one object a line, e.g. {\"text\": \"...\"}")
        yield line_no, _text_of(record, text_field, where, sorted(record))


def _text_of(record: dict, text_field: str, where: str, keys: list[str]) -> bytes:
    if text_field not in record:
        shown = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "") or "none"
        raise CorpusError(f"{where}: no {text_field!r} field (its keys: {shown}); name the field that holds the text "
                          "with the run config's [data] text_field = \"KEY\" (or `swarmloco prepare-data --text-field KEY`)")
    value = record[text_field]
    if value is None:
        return b""
    if not isinstance(value, str):
        raise CorpusError(f"{where}: {text_field!r} is a JSON {type(value).__name__}, not a string; "
                          "pick the field that holds the text with [data] text_field (or prepare-data --text-field)")
    return value.encode("utf-8", errors="replace")  # "replace": a lone surrogate escape is not UTF-8


def _parquet_records(path: Path, text_field: str) -> Iterator[tuple[int, bytes]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpusError(f"{path}: reading Parquet needs pyarrow: pip install 'swarmloco[parquet]' "
                          "(or pip install pyarrow)") from None
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise CorpusError(f"{path}: not a readable Parquet file ({exc}); write it again, or rename it if it is not Parquet") from None
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        shown = ", ".join(repr(n) for n in schema.names[:8]) + (", ..." if len(schema.names) > 8 else "")
        raise CorpusError(f"{path}: no {text_field!r} column (its columns: {shown or 'none'}); name the column that holds "
                          "the text with the run config's [data] text_field = \"COLUMN\" (or `swarmloco prepare-data --text-field COLUMN`)")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or getattr(pa.types, "is_string_view", lambda _: False)(kind)):
        raise CorpusError(f"{path}: column {text_field!r} holds {kind}, not strings; pick the text column with [data] text_field (or prepare-data --text-field) "
                          "(or cast it to strings when writing the file)")
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_field]):
            for value in batch.column(0).to_pylist():
                yield row, value.encode("utf-8", errors="replace") if value else b""
                row += 1
    except (pa.ArrowException, OSError) as exc:
        raise CorpusError(f"{path}: cannot read past row {row} ({exc}); the file is damaged: copy or write it again") from None
    finally:
        parquet.close()


# --- not text --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NotText:
    """Why a file's head is not text: its share of non-text bytes and of NUL bytes."""

    path: Path
    share: float  # invalid UTF-8 + control bytes, of the head
    nul_share: float
    sampled: int  # bytes of the head

    def describe(self) -> str:
        whole = self.sampled < SAMPLE_BYTES  # a shorter head is the whole file
        where = f"all {self.sampled:,} bytes" if whole else f"its first {SAMPLE_BYTES // 1024} KiB"
        nul = f", {self.nul_share:.1%} of them NUL" if self.nul_share else ""
        return f"{self.share:.0%} of the bytes in {self.path} are not UTF-8 text ({where} read{nul})"


def not_text(path: Path, head: bytes) -> NotText | None:
    """A NotText when `head` (a file's first min(size, SAMPLE_BYTES) bytes) is not text, else None."""
    head = head[:SAMPLE_BYTES]
    if not head:
        return None
    invalid = 0 if head.isascii() else _invalid_utf8_bytes(head)
    controls = len(head) - len(head.translate(None, _CONTROL))
    share, nul_share = (invalid + controls) / len(head), head.count(0) / len(head)
    if share > NOT_TEXT_LIMIT or nul_share > NUL_LIMIT:
        return NotText(path, share, nul_share, len(head))
    return None


def _invalid_utf8_bytes(data: bytes) -> int:
    decoded = data.decode("utf-8", errors="replace")
    bad_runs = decoded.count("\ufffd")  # each invalid run becomes one U+FFFD (3 bytes) when re-encoded
    return len(data) - (len(decoded.encode("utf-8")) - 3 * bad_runs)


@dataclass
class ReadStats:
    """What reading a corpus met: files of each kind, records skipped as empty, binary files skipped."""

    source: str
    files: dict[str, int] = field(default_factory=lambda: {"text": 0, "jsonl": 0, "parquet": 0})
    records: int = 0
    empty_records: int = 0
    skipped: list[NotText] = field(default_factory=list)

    def admit_text(self, path: Path, head: bytes, *, single: bool) -> bool:
        """Whether a text file goes into the corpus: False (remembered) for a binary file in a
        folder; a single binary --data file is refused here."""
        found = not_text(path, head)
        if found is None:
            return True
        if single:
            raise CorpusError(f"{found.describe()}: {WHAT_TO_DO}")
        self.skipped.append(found)
        return False

    def finish(self) -> None:
        """After the last file: refuse a folder where every file read was binary, warn when some were."""
        if not self.skipped:
            return
        example = self.skipped[0].describe()
        if not any(self.files.values()):
            raise CorpusError(f"--data {self.source}: none of its {len(self.skipped)} file(s) is text (e.g. {example}): {WHAT_TO_DO}")
        log.warning("--data %s: skipped %d file(s) that are not text (e.g. %s); only text, .jsonl and .parquet files train",
                    self.source, len(self.skipped), example)

    def summary(self) -> str:
        """For prepare-data's report line: '3 text + 1 jsonl file(s), 400 records (2 empty skipped)'."""
        kinds = " + ".join(f"{n} {kind}" for kind, n in self.files.items() if n) or "no"
        parts = [f"{kinds} file(s)"]
        if self.records or self.empty_records:
            parts.append(f"{self.records:,} records" + (f" ({self.empty_records:,} empty skipped)" if self.empty_records else ""))
        if self.skipped:
            parts.append(f"{len(self.skipped)} binary file(s) skipped")
        return ", ".join(parts)


def split_records(path: Path, relative: str, text_field: str, is_validation, stats: ReadStats) -> Iterator[tuple[bool, bytes]]:
    """(is_validation, text) of each non-empty record of a .jsonl/.parquet file; a record's split is
    a stable hash of record_key(relative, key), so a big file feeds both splits in one pass."""
    stats.files[file_format(path)] += 1
    for key, text in records(path, text_field):
        if not text:
            stats.empty_records += 1
            continue
        stats.records += 1
        yield is_validation(record_key(relative, key)), text


def head_of(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(SAMPLE_BYTES)

