"""Streaming readers: each yields `Doc`s in input order, one per document, memory flat however large the input.

A document's position (0, 1, 2, ... over the documents, blank JSONL lines skipped) decides its window, so it
must not depend on anything but the input. Ids come from `--id-field`, else from the line number (JSONL:
the file's line, a JSON array: the element, CSV: the data row, Parquet: the row, all from 1) or the file's path
relative to the folder. A document that cannot be read keeps its position and carries `reason` instead of a
text (rejects.jsonl); so does one whose id an earlier document has (`unique_ids`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True)
class Doc:
    pos: int
    id: str
    text: str | None  # None: `reason` says why it cannot be embedded
    reason: str = ""


def detect_format(path: Path, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "text"
    suffix = path.suffix.lower()
    if suffix == ".json":  # one array of records, or JSON Lines under another name
        with open(path, "rb") as f:
            return "json" if f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[") else "jsonl"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise SystemExit(f"ivy index: cannot tell the format of {path} from its name; pass --format")


def _make(pos: int, record_id: Any, fallback: str, text: Any) -> Doc:
    doc_id = fallback if record_id is None or record_id == "" else str(record_id)
    if text is None:
        return Doc(pos, doc_id, None, "no text field")
    if not isinstance(text, str):
        return Doc(pos, doc_id, None, f"text is a {type(text).__name__}, not a string")
    if not text.strip():
        return Doc(pos, doc_id, None, "empty text")
    return Doc(pos, doc_id, text)


def _record(pos: int, record: Any, fallback: str, id_field: str, text_field: str, what: str) -> Doc:
    if not isinstance(record, dict):
        return Doc(pos, fallback, None, f"{what} is not a JSON object")
    doc = _make(pos, record.get(id_field), fallback, record.get(text_field))
    if _has_surrogates(doc.id):  # "\ud800" is valid JSON but no UTF-8: neither a shard nor a server takes it
        return Doc(doc.pos, fallback, None, "id holds a lone surrogate escape (not valid Unicode)")
    if doc.text is not None and _has_surrogates(doc.text):
        return Doc(doc.pos, doc.id, None, "text holds a lone surrogate escape (not valid Unicode)")
    return doc


def _jsonl(path: Path, id_field: str, text_field: str, start: int) -> Iterator[Doc]:
    pos = 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            pos += 1
            if pos <= start:  # committed already: not parsed again
                continue
            fallback = str(line_no)
            try:  # a byte order mark (Windows tools) starts the file, not the first record
                record = json.loads(raw.decode("utf-8-sig" if line_no == 1 else "utf-8"))
            except UnicodeDecodeError:
                yield Doc(pos - 1, fallback, None, "line is not valid UTF-8")
                continue
            except ValueError as exc:
                yield Doc(pos - 1, fallback, None, f"line is not JSON: {exc.msg}")
                continue
            yield _record(pos - 1, record, fallback, id_field, text_field, "line")


def _json_array(path: Path, id_field: str, text_field: str, start: int) -> Iterator[Doc]:
    """A file holding one JSON array of records: parsed whole (the stdlib cannot stream an array), so its
    memory is the file's a few times over; JSON Lines stream."""
    try:
        records = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SystemExit(f"ivy index: {path} is not valid JSON: {exc}") from None
    if not isinstance(records, list):
        raise SystemExit(f"ivy index: {path} holds a JSON {type(records).__name__}, not an array of records")
    for pos in range(start, len(records)):
        yield _record(pos, records[pos], str(pos + 1), id_field, text_field, "element")


def _has_surrogates(value: str) -> bool:
    try:
        value.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _csv(path: Path, id_field: str, text_field: str, start: int) -> Iterator[Doc]:
    csv.field_size_limit(sys.maxsize)
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    # surrogateescape: a row with bad bytes is read (and rejected) instead of failing the whole file
    # utf-8-sig: a byte order mark (Excel's "CSV UTF-8") is not part of the first column's name
    # TSV has no quoting: a line is a record and a `"` is text (quoting made an unclosed one swallow the rest)
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
        header = next(reader, None) or []
        if text_field not in header:
            raise SystemExit(f"ivy index: {path} has no column {text_field!r} (columns: {', '.join(header)})")
        t, i = header.index(text_field), header.index(id_field) if id_field in header else None
        for pos, row in enumerate(islice(reader, start, None), start):
            fallback = str(pos + 1)
            if any(map(_has_surrogates, row)):
                yield Doc(pos, fallback, None, "row is not valid UTF-8")
                continue
            record_id = row[i] if i is not None and i < len(row) else None
            yield _make(pos, record_id, fallback, row[t] if t < len(row) else None)


def _parquet(path: Path, id_field: str, text_field: str, start: int) -> Iterator[Doc]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if text_field not in names:
        raise SystemExit(f"ivy index: {path} has no column {text_field!r} (columns: {', '.join(names)})")
    columns = [text_field] + ([id_field] if id_field in names and id_field != text_field else [])
    pos, first_group = 0, 0
    for g in range(pf.num_row_groups):  # skip whole row groups that were committed
        rows = pf.metadata.row_group(g).num_rows
        if pos + rows > start:
            break
        pos, first_group = pos + rows, g + 1
    groups = list(range(first_group, pf.num_row_groups))
    if not groups:
        return
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups, columns=columns):
        texts = batch.column(text_field).to_pylist()
        ids = batch.column(id_field).to_pylist() if id_field in columns else [None] * len(texts)
        for record_id, text in zip(ids, texts):
            if pos >= start:
                yield _make(pos, record_id, str(pos + 1), text)
            pos += 1


def text_files(folder: Path) -> Iterator[Path]:
    """Every regular, non-hidden file under `folder`, in a fixed (sorted) order."""
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not any(part.startswith(".") for part in rel.parts):
            yield path


def fingerprint(path: Path) -> dict:
    """What a resumed run checks its input against: a file's size and modification time, or a hash of a folder's
    listing (each file's relative path and size), since a file added or removed shifts every later file's position.

    A file's size alone let a same-size edit through (a fixed-width field rewritten, one line's bytes moved to
    another), and a file's positions are its lines or rows, so the committed windows no longer matched it. Size
    and mtime_ns are rsync's quick check: one stat whatever the size, and every write updates the mtime. A hash
    of the content would be exact but costs a whole extra read of the input at every start and resume, before
    the first batch (minutes for a corpus of tens of GB; a Parquet input is otherwise read only from the first
    uncommitted row group on). What it misses: a same-size rewrite that also sets the old mtime back (touch -r,
    cp -p of another file); what it refuses needlessly: an identical copy or a touched file (the safe side)."""
    if path.is_file():
        stat = path.stat()
        return {"input_bytes": stat.st_size, "input_mtime_ns": stat.st_mtime_ns}
    digest = hashlib.sha256()
    for file in text_files(path):
        digest.update(f"{file.relative_to(path).as_posix()}\0{file.stat().st_size}\n".encode(errors="surrogateescape"))
    return {"input_bytes": None, "input_listing": digest.hexdigest()}


def _folder(folder: Path, start: int) -> Iterator[Doc]:
    for pos, path in enumerate(islice(text_files(folder), start, None), start):
        doc_id = path.relative_to(folder).as_posix()
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            yield Doc(pos, doc_id, None, "file is not valid UTF-8")
            continue
        except OSError as exc:
            yield Doc(pos, doc_id, None, f"unreadable: {exc.strerror or exc}")
            continue
        yield _make(pos, None, doc_id, text)


def read_docs(path: Path, fmt: str, id_field: str, text_field: str, start: int = 0) -> Iterator[Doc]:
    """The documents from position `start` on."""
    if fmt == "jsonl":
        return _jsonl(path, id_field, text_field, start)
    if fmt == "json":
        return _json_array(path, id_field, text_field, start)
    if fmt == "csv":
        return _csv(path, id_field, text_field, start)
    if fmt == "parquet":
        return _parquet(path, id_field, text_field, start)
    return _folder(path, start)


def count_docs(path: Path, fmt: str) -> int | None:
    """How many documents there are (for the ETA), cheaply; None when only a full parse could tell (CSV, JSON)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if fmt == "jsonl":
        with open(path, "rb") as f:
            return sum(1 for raw in f if raw.strip())
    if fmt == "text":
        return sum(1 for _ in text_files(path))
    return None


def unique_ids(docs: Iterator[Doc], seen: set[str]) -> Iterator[Doc]:
    """Each id once in the output: a document whose id an earlier one has (given, or the line number standing in
    for a missing id) is rejected like an unreadable one. `seen` holds every id so far, the committed windows'
    included on a resume: about 100 bytes an id, so ~1 GB for 10 million documents."""
    for doc in docs:
        if doc.id in seen:
            yield Doc(doc.pos, doc.id, None, "id already used by an earlier document (embedded or rejected)")
        else:
            seen.add(doc.id)
            yield doc
