"""Structured logs: one JSON object per line, carrying the request id of the current request.

The request id comes from the client's `X-Request-Id` (when it is sane) or is generated, is
returned in the response header, and is attached to every log record emitted while the request
is served (a context variable, so concurrent requests never mix their ids).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def new_request_id(client_value: str | None) -> str:
    """The client's id if it is safe to log, else a fresh one."""
    if client_value and _SANE_ID.match(client_value):
        return client_value
    return os.urandom(16).hex()  # as unique as a uuid4, at a third of its cost


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", "request_id", ...extra}`."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": request_id.get(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """Kubernetes style: `time level msg key=value ...` with the request id."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        stamp = self.formatTime(record)
        line = f"{stamp} {record.levelname} {record.getMessage()} request_id={request_id.get()}"
        if extras:
            line += " " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str, as_json: bool) -> None:
    """Set up the `boomerang.router` logger (idempotent)."""
    logger = logging.getLogger("boomerang.router")
    logger.setLevel(level.upper())
    for handler in list(logger.handlers):
        if getattr(handler, "_boomerang", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._boomerang = True  # type: ignore[attr-defined]
    if as_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    logger.addHandler(handler)
    logger.propagate = False
