"""How Ivy, Tulip and `ivy index` write their logs: lines for people (`text`, the default) or one JSON object a
line for a log pipeline (`json`: `IVY_LOG_FORMAT`, `TULIP_LOG_FORMAT`, `IVY_INDEX_LOG_FORMAT`), as
text-embeddings-inference's `--json-output` does.

A JSON line has `time` (UTC, RFC 3339 with milliseconds), `level`, `logger`, `message`, `service`, `pid`, the
request id of the request being served when there is one (`request_id`, from the context hook a service passes),
`exception` (the formatted traceback) when one is logged, and any fields a call passes with `extra=`. Every
logger goes through the root's one handler on stderr, uvicorn's included (it is started with `log_config=None`),
so a line never comes out in two formats. Torch-free: Ivy imports it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime",
                                                                                   "color_message"}  # (uvicorn's)


def check_format(value: str, flag: str) -> None:
    if value not in FORMATS:
        raise ValueError(f"{flag} must be one of {', '.join(FORMATS)}, not {value!r}")


class JsonFormatter(logging.Formatter):
    """One JSON object per record. `context` returns fields of the work in progress (a request id), read when
    the record is formatted, in the thread and context that logged it."""

    def __init__(self, service: str, context: Callable[[], dict] | None = None) -> None:
        super().__init__()
        self.service, self.context, self.pid = service, context, os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        extra = {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and not k.startswith("_")}
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
                + f".{int((record.created - seconds) * 1000):03d}Z",
                "level": record.levelname, "logger": record.name, "message": record.getMessage(),
                "service": self.service, "pid": self.pid}
        if self.context is not None:
            line.update({k: v for k, v in self.context().items() if v})
        line.update({k: v for k, v in extra.items() if k not in line})  # a call's extras never replace these
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        try:  # strict JSON: no NaN or Infinity, string keys only
            return json.dumps(line, default=str, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):  # an extra JSON cannot hold: its repr, the line kept
            line.update({k: repr(v) for k, v in extra.items() if k in line and line[k] is v})
            return json.dumps(line, default=str, ensure_ascii=False)


def setup(level: str, fmt: str, service: str, context: Callable[[], dict] | None = None,
          access_log: bool = False) -> None:
    """The root logger's one handler, on stderr, in `fmt`; replaces the plain stream handlers set before (ours
    again, or basicConfig's) and keeps any other (a test runner's capture). uvicorn's access log (a line per
    request) only with `access_log`: uvicorn's protocol logs a request whenever "uvicorn.access" has a handler,
    its own or the root's through propagation, and a worker sets up its logging after uvicorn's access_log=False
    has cleared it."""
    check_format(fmt, "log format")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service, context) if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    for old in list(root.handlers):
        if type(old) is logging.StreamHandler:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # Python's warnings as records too ("py.warnings"), not bare stderr lines
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # theirs go to the root's handler, at its level
        logger = logging.getLogger(name)  # (uvicorn.run sets their level to the same log level afterwards)
        logger.handlers.clear()
        logger.propagate, logger.disabled = name != "uvicorn.access" or access_log, False
        logger.setLevel(logging.NOTSET)
