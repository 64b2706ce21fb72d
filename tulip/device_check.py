"""Whether a failed batch left the device able to run work (RELIABILITY 62).

Most engine failures belong to one batch (out of memory, a bad input, a head's error): the replica answers that
batch's requests with the error and serves on (RELIABILITY 36). Some CUDA errors poison the whole context instead
(an illegal address, a device-side assert, an uncorrectable ECC error, a GPU gone from the bus): every later call
fails the same way, so a replica that served on would answer every request it took with an error while its health
said SERVING, and nothing would restart it. So after a batch fails (other than out of memory) the engine's own
`device_ok()` runs a tiny step on the device (on the completer's thread: a launch that raised is handed to it,
so the event loop never waits on the device); when that fails too, the device is lost: the failed batch, and every
request after it, is answered DeviceLost (UNAVAILABLE, which Ivy retries on another replica; those still queued at
once, none launched once the loss is known: tulip.worker), and `on_lost` tells the server, which refuses new work,
drains and exits with status 3 for the orchestrator to restart it. An engine without `device_ok` (a fake, a CPU
engine) is never found lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tulip.errors import DeviceLost, EngineOverloaded, TulipError, engine_error

log = logging.getLogger("tulip.device")


class DeviceCheck:
    def __init__(self, engine, on_lost: Callable[[str], None] | None = None) -> None:
        self._probe = getattr(engine, "device_ok", None)
        self.on_lost = on_lost  # called once, on whichever thread found the loss
        self.lost: str | None = None  # what failed, once the device is lost
        self._lock = threading.Lock()

    def error_for(self, exc: BaseException) -> TulipError:
        """The caller-facing error for a batch that raised `exc` (engine.step() or LazyTensor.wait()): DeviceLost
        once the device runs no work, else engine_error's. Probes the device only for a failure that is not out
        of memory, and only until the device is found lost."""
        if self.lost is None:
            error = engine_error(exc)
            if isinstance(error, EngineOverloaded) or self._probe is None or self._runs():
                return error
            self._lose(exc)
        return self.error()

    def error(self) -> DeviceLost:
        """What every request gets once the device is lost."""
        return DeviceLost(f"this replica's GPU no longer runs work ({self.lost}); retry on another replica")

    def _runs(self) -> bool:
        try:
            return bool(self._probe())
        except Exception:  # noqa: BLE001 - a probe that cannot even ask the device has found it lost
            log.exception("the device probe raised")
            return False

    def _lose(self, exc: BaseException) -> None:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = f"{type(exc).__name__}: {first_line}"[:200]
        log.critical("the device no longer runs work after a batch failed (%s): refusing new work, draining, then "
                     "exiting for a restart", self.lost)
        if self.on_lost is not None:
            self.on_lost(self.lost)
