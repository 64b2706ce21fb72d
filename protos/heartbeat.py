"""A Tulip's batch count in a file (TULIP_ACTIVITY_FILE; tulip/worker.py writes it, `ivy up` reads it to run its
warm-cores loops only while its Tulips work: ivy/warm_cores.py).

The file holds one little-endian uint64, the batches launched so far, written through a shared mapping (one
store per batch, no system call). Readers only compare values, so a count lost to two launchers racing is
harmless: it still changes.
"""

from __future__ import annotations

import mmap
import os
import struct

_COUNT = struct.Struct("<Q")


class Heartbeat:
    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _COUNT.size:
                os.ftruncate(fd, _COUNT.size)
            self._map = mmap.mmap(fd, _COUNT.size)
        finally:
            os.close(fd)
        self.count = _COUNT.unpack_from(self._map)[0]

    def beat(self) -> None:
        self.count += 1
        _COUNT.pack_into(self._map, 0, self.count & 0xFFFF_FFFF_FFFF_FFFF)

    def close(self) -> None:
        self._map.close()


class CountReader:
    """A count read through a descriptor opened once: it survives the file's name being removed. `ivy up` keeps its
    counters' folder until the stack stops: a Tulip it starts again opens its slot's file, so its batches move the
    count this reader reads (a Heartbeat goes on from the file's count)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)

    def read(self) -> int | None:
        data = os.pread(self._fd, _COUNT.size, 0)
        return _COUNT.unpack(data)[0] if len(data) == _COUNT.size else None

    def close(self) -> None:
        os.close(self._fd)


def read_count(path: str) -> int | None:
    """The count in `path`; None while it is missing or short (the replica has not started it yet)."""
    try:
        reader = CountReader(path)
    except OSError:
        return None
    try:
        return reader.read()
    finally:
        reader.close()
