"""The platform's own log lines: JSON lines for machines, or text for people, from every process (the supervisor,
the API's workers, the Celery worker and beat), each line with the request, job and team it concerns.

One switch, `RELAX_LOG_FORMAT`:
- `json`: one JSON object a line: `time` (UTC, ISO 8601, milliseconds), `level`, `logger`, `message`, `part`
  (supervisor, api, worker, beat), `pid`, then `request_id`, `job_id`, `team` where known, and `exc` (the
  traceback) for an exception;
- `text`: `2026-12-05 07:50:01,123 INFO relax.api [req=… job=… team=…]: message`;
- `auto` (the default): text when the process writes to a terminal, else JSON (the embedded platform's parts write
  to `$RELAX_HOME/logs/<part>.log`: JSON; its supervisor in a terminal: text).

The context comes from `log_context`: a request's middleware opens one with its id, and what learns more later
(the caller's team, the job a route or task works on) adds to it with `annotate`; every line logged meanwhile, in
whichever thread the request's work runs, carries it. Records are redacted before they are formatted
(runtime/redaction.py), in either format.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

LOG_FORMAT_ENV = "RELAX_LOG_FORMAT"
FORMATS = ("auto", "json", "text")
CONTEXT_FIELDS = ("request_id", "job_id", "team")

# One dict per request or task, shared by reference: the copies of the context that the thread pool's workers
# run in see what the request's own task adds to it later, and the other way round.
_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "relax_log_context", default=None
)


@contextmanager
def log_context(**fields: str | None) -> Iterator[dict[str, str]]:
    """Lines logged inside carry `fields` (and what `annotate` adds); an enclosing context's fields stay."""
    outer = _context.get()
    ctx = {**(outer or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(ctx)
    try:
        yield ctx
    finally:
        _context.reset(token)


def annotate(**fields: str | None) -> None:
    """Add fields to the current context, or remove those given as None (no-op outside a context)."""
    ctx = _context.get()
    if ctx is not None:
        for key, value in fields.items():
            if value is None:
                ctx.pop(key, None)
            else:
                ctx[key] = value


def current_context() -> dict[str, str]:
    return dict(_context.get() or {})


class _ContextFilter(logging.Filter):
    """Puts the context's fields and the part's name on every record (a field given with `extra=` wins)."""

    def __init__(self, part: str) -> None:
        super().__init__()
        self.part = part

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _context.get()
        if ctx:
            for key in CONTEXT_FIELDS:
                if key in ctx and not hasattr(record, key):
                    setattr(record, key, ctx[key])
        if not hasattr(record, "part"):
            record.part = self.part
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line (see the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "part": getattr(record, "part", None),
            "pid": record.process,
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger [req=… job=… team=…]: message`, the context only where there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(relax_context)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        names = {"request_id": "req", "job_id": "job", "team": "team"}
        given = [f"{names[k]}={getattr(record, k)}" for k in CONTEXT_FIELDS if getattr(record, k, None)]
        record.relax_context = f" [{' '.join(given)}]" if given else ""
        return super().format(record)


def chosen_format(stream: TextIO | None = None) -> str:
    """`json` or `text`, from RELAX_LOG_FORMAT (see the module's docstring). A value it does not know is an error
    that names the variable and its values: a process must not start with logs nobody can read."""
    value = os.environ.get(LOG_FORMAT_ENV, "auto").strip().lower() or "auto"
    if value not in FORMATS:
        raise ValueError(f"{LOG_FORMAT_ENV}={value!r} is not a log format: use one of {', '.join(FORMATS)}")
    if value == "auto":
        stream = stream or sys.stderr
        return "text" if getattr(stream, "isatty", lambda: False)() else "json"
    return value


def make_handler(part: str, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing to `stream` (stderr) in the chosen format, with the context and `part` on each line."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if chosen_format(stream) == "json" else TextFormatter())
    handler.addFilter(_ContextFilter(part))
    return handler


# Loggers that other libraries give handlers of their own: their records go to the root's instead.
_OWN_HANDLERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "celery.task", "celery.redirected")


def configure_logging(part: str, *, level: int | str = logging.INFO, stream: TextIO | None = None) -> str:
    """Log every record of this process (the root logger, and uvicorn's and Celery's) to `stream` (stderr) in the
    chosen format, with the context and `part`. Returns the format."""
    handler = make_handler(part, stream)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in _OWN_HANDLERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
    logging.captureWarnings(True)
    return chosen_format(stream or sys.stderr)


def uvicorn_log_config(part: str) -> dict[str, Any]:
    """uvicorn's `--log-config` (a dictConfig, as JSON): the parent process of several workers and each worker log
    as `configure_logging` does (uvicorn applies it before anything else logs)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"relax": {"()": "scheduler.logs.make_handler", "part": part}},
        "root": {"handlers": ["relax"], "level": "INFO"},
        "loggers": {name: {"handlers": [], "propagate": True} for name in _OWN_HANDLERS[:3]},
    }


def main(argv: list[str] | None = None) -> None:
    """`python -m scheduler.logs uvicorn-config PART`: print uvicorn's --log-config for PART (JSON)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "uvicorn-config":
        raise SystemExit("usage: python -m scheduler.logs uvicorn-config PART")
    chosen_format()  # a wrong RELAX_LOG_FORMAT stops the start here, saying so
    print(json.dumps(uvicorn_log_config(args[1])))


if __name__ == "__main__":
    main()
