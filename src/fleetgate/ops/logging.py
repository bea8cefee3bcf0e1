"""Structured logs: one JSON object per line, with the request id of the request being handled.

- ``setup_logging(level, fmt)`` installs one stderr handler on the root logger (``json`` or ``text``).
- ``request_context_middleware`` puts the gateway's ``x-request-id`` (the error middleware accepts a sane
  client id or makes one, and returns it) into a context variable, so every line logged while handling that
  request carries ``request_id`` without passing it around.
- Secrets and prompt text never reach the output by default: extra fields whose names look like keys,
  authorization headers or prompt/message content are replaced by ``"[redacted]"``. The gateway itself logs
  no bodies; this is a guard against future ``log.info(..., extra={"messages": ...})`` mistakes.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import IO, Any

import orjson
from aiohttp import web

from fleetgate.gateway.errors import REQUEST_ID as REQUEST_KEY

REQUEST_ID: ContextVar[str | None] = ContextVar("fleetgate_request_id", default=None)

SENSITIVE_FIELDS = frozenset(
    {
        "authorization",
        "api_key",
        "api_keys",
        "key",
        "password",
        "secret",
        "token",
        "messages",
        "prompt",
        "content",
        "input",
        "body",
    }
)
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id"?, extras..., "exc"?}`` per line."""

    def __init__(self, *, redact: bool = True) -> None:
        super().__init__()
        self.redact = redact
        self._second = -1
        self._prefix = ""

    def _timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:  # strftime once per second, not once per line
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": _LEVEL_NAMES.get(record.levelno) or record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        attrs = record.__dict__
        request_id = attrs.get("request_id") or REQUEST_ID.get()
        if request_id:
            data["request_id"] = request_id
        for key, value in attrs.items():
            if key in _STANDARD or key in data or key[0] == "_":
                continue
            data[key] = "[redacted]" if self.redact and key.lower() in SENSITIVE_FIELDS else value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data, default=str).decode()


_LEVEL_NAMES = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "critical",
}


class TextFormatter(logging.Formatter):
    """Human-readable lines, with the request id when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        # ``extra={"request_id": ...}`` sets arbitrary attributes on a LogRecord: read it by name
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        return f"{line} request_id={request_id}" if request_id else line


class _FleetgateHandler(logging.StreamHandler):
    """fleetgate's own root handler (its type tells it apart when ``setup_logging`` runs again)."""


def setup_logging(
    level: str | int = "INFO", fmt: str = "json", stream: IO[str] | None = None
) -> logging.Handler:
    """Install (or replace) fleetgate's handler on the root logger; returns it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _FleetgateHandler):
            root.removeHandler(handler)
    handler = _FleetgateHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    return handler


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def request_context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Expose the request id to every log line emitted while handling the request."""
    token = REQUEST_ID.set(request.get(REQUEST_KEY))
    try:
        return await handler(request)
    finally:
        REQUEST_ID.reset(token)
