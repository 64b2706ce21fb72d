"""The output folder: Parquet shards, the manifest and rejects.jsonl, each written so that a kill at any moment
(SIGKILL included) leaves only committed work visible.

Commit of window k: the shard goes to `part-0000k.parquet.tmp`, is fsynced and renamed (os.replace); its
rejects are appended to rejects.jsonl and fsynced; then the manifest (JSON, the truth) is replaced atomically,
recording the shard, the positions it covers and rejects.jsonl's committed length. A resumed run deletes what
the manifest does not name (a renamed shard of an uncommitted window, *.tmp) and cuts rejects.jsonl back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"
VERSION = 2  # 2: a file input's identity holds its mtime (input_mtime_ns); 1 held its size only
INPUT_KEYS = frozenset({"input_bytes", "input_mtime_ns", "input_listing"})  # ivy.index.sources' fingerprint


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _recorded_identity(manifest: dict, identity: dict) -> dict:
    """The manifest's identity as this version records it. Version 1 recorded a file input's size only: its mtime
    is taken as this run finds it, which checks what version 1 checked, and is recorded from now on."""
    recorded = manifest["identity"]
    if manifest.get("version", 1) < 2 and "input_mtime_ns" in identity:
        recorded = {**recorded, "input_mtime_ns": identity["input_mtime_ns"]}
    return recorded


@dataclass(frozen=True)
class Layout:
    """What every shard holds: the model, the width of a row and the encoding."""

    model: str
    dimensions: int  # the embedding's dimensions (binary: bits)
    encoding: str  # float -> fixed-size list of float32; base64_int8 / base64_binary -> binary (the bytes)

    def schema(self, extra: dict[str, str]) -> pa.Schema:
        embedding = (pa.list_(pa.float32(), self.dimensions) if self.encoding == "float" else pa.binary())
        meta = {"model": self.model, "dimensions": str(self.dimensions), "encoding": self.encoding, **extra}
        return pa.schema([("id", pa.string()), ("embedding", embedding)], metadata=meta)

    def table(self, ids: list[str], rows: np.ndarray, extra: dict[str, str]) -> pa.Table:
        schema = self.schema(extra)
        if self.encoding == "float":
            flat = pa.array(np.ascontiguousarray(rows, dtype=np.float32).reshape(-1), pa.float32())
            column = pa.FixedSizeListArray.from_arrays(flat, self.dimensions)
        else:
            column = pa.array([np.ascontiguousarray(r).tobytes() for r in rows], pa.binary())
        return pa.Table.from_arrays([pa.array(ids, pa.string()), column], schema=schema)


class Sink:
    def __init__(self, folder: Path, identity: dict, resume: bool) -> None:
        """`identity`: input, options and model; a resumed run must match it exactly."""
        self.folder = folder
        self.identity = identity
        path = folder / MANIFEST
        if path.exists():
            if not resume:
                raise SystemExit(f"ivy index: {folder} holds a run already; pass --resume to continue it "
                                 "or choose another OUTPUT")
            self.manifest = json.loads(path.read_text())
            recorded = _recorded_identity(self.manifest, identity)
            if recorded != identity:
                changed = sorted(k for k in identity if identity[k] != recorded.get(k))
                if INPUT_KEYS & set(changed):  # its windows would be other documents
                    raise SystemExit(f"ivy index: cannot resume {folder}: INPUT changed since its run (a file's "
                                     "size or modification time, a folder's file names or sizes); choose another "
                                     "OUTPUT")
                raise SystemExit(f"ivy index: cannot resume {folder}: {', '.join(changed)} differ from its run")
            self.manifest.update(version=VERSION, identity=identity)  # saved with the next commit
            self._clean()
        else:
            if folder.exists() and any(folder.glob("part-*.parquet")):
                raise SystemExit(f"ivy index: {folder} holds shards but no {MANIFEST}; choose another OUTPUT")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / REJECTS).unlink(missing_ok=True)
            self.manifest = {"version": VERSION, "identity": identity, "shards": [], "rejects_bytes": 0,
                             "complete": False}
            self._save()  # before any shard: a kill between the first shard's rename and its manifest resumes
        self._rejects = open(folder / REJECTS, "ab")

    def _clean(self) -> None:
        keep = {s["file"] for s in self.manifest["shards"]}
        for stray in [*self.folder.glob("*.tmp"), *self.folder.glob("part-*.parquet")]:
            if stray.name not in keep:
                stray.unlink()
        rejects = self.folder / REJECTS
        with open(rejects, "ab") as f:
            f.truncate(self.manifest["rejects_bytes"])

    @property
    def next_window(self) -> int:
        return len(self.manifest["shards"])

    @property
    def complete(self) -> bool:
        return self.manifest["complete"]

    def totals(self) -> tuple[int, int, int]:
        """(documents, rejects, tokens) the committed shards hold."""
        shards = self.manifest["shards"]
        return tuple(sum(s[k] for s in shards) for k in ("rows", "rejects", "tokens"))

    def committed_ids(self):
        """Every id the committed windows hold, in their shards or rejects.jsonl."""
        for shard in self.manifest["shards"]:
            yield from pq.read_table(self.folder / shard["file"], columns=["id"]).column("id").to_pylist()
        with open(self.folder / REJECTS, "rb") as f:
            for line in f:
                yield json.loads(line)["id"]

    def commit(self, window: int, first: int, end: int, table: pa.Table, rejects: list[dict],
               tokens: int) -> None:
        assert window == self.next_window, "windows are committed in order"
        name = f"part-{window:06d}.parquet"
        _write_atomic(self.folder / name, lambda f: pq.write_table(table, f))
        if rejects:
            self._rejects.write(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rejects))
            self._rejects.flush()
            os.fsync(self._rejects.fileno())
        self.manifest["shards"].append({"window": window, "file": name, "first": first, "end": end,
                                        "rows": table.num_rows, "rejects": len(rejects), "tokens": tokens})
        self.manifest["rejects_bytes"] = self._rejects.tell()
        self._save()

    def finish(self) -> None:
        self.manifest["complete"] = True
        self._save()
        self._rejects.close()

    def close(self) -> None:
        self._rejects.close()

    def _save(self) -> None:
        data = json.dumps(self.manifest, indent=1).encode()
        _write_atomic(self.folder / MANIFEST, lambda f: f.write(data))
