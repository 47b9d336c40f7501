"""Secrets out of logs, error bodies and messages: `redact(text)` and a process-wide log record hook.

What counts as a secret: the platform's credentials by prefix (`rlx_` API keys, `rjt_` job tokens,
`rjb_` bootstrap secrets, `rjd_` secrets derived from a job token, `rlc_` login codes), any `Bearer …`
value and `Authorization:` header value, values assigned to the secret environment variables (`RELAX_SECRET_KEY=…`, `RAY_AUTH_TOKEN=…`, …),
passwords inside URLs (`postgresql://user:pw@host`), and exact values registered at run time with
`register_secret` (the signing key, Ray's token: neither has a recognisable shape).

A leaf module (standard library only): the API, the scheduler's workers and the driver all use it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

MASK = "[redacted]"
# Prefixes of the platform's own credentials (kept in sync with scheduler/services/auth.py).
SECRET_PREFIXES = ("rlx_", "rjt_", "rjb_", "rjd_", "rlc_")
# Environment variables whose values are secrets: the platform's and Ray's whose names end in KEY, TOKEN,
# SECRET, PASSWORD or BOOTSTRAP (RELAX_SECRET_KEY, RELAX_API_KEY, RELAX_JOB_BOOTSTRAP, RAY_AUTH_TOKEN, …).
# `install_log_redaction` registers their values; `NAME=value` is masked wherever it appears.
SECRET_ENV_NAME = re.compile(r"^(?:RELAX|RAY)_[A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|BOOTSTRAP)$")

_TOKEN_CHARS = r"[A-Za-z0-9_\-.~+/=]"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"(?i)\b(bearer)(\s+){_TOKEN_CHARS}{{4,}}"), rf"\1\2{MASK}"),
    # `_` or `-`: the spec's key normalisation turns one into the other
    (re.compile(r"\b(rlx|rjt|rjb|rjd|rlc)[_-][A-Za-z0-9_\-.]{4,}"), rf"\1_{MASK}"),
    (  # any other scheme (Basic, Token, …) or a bare credential
        re.compile(
            r"""(?i)(\bauthorization["']?\s*[:=]\s*["']?)(?!bearer\s)(?:[A-Za-z]+\s+)?(?!\[redacted)[^\s"',}]+"""
        ),
        rf"\1{MASK}",
    ),
    (
        re.compile(
            r"""\b((?:RELAX|RAY)_[A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|BOOTSTRAP))"""
            r"""(["']?\s*[=:]\s*["']?)(?!\[redacted)[^\s"',}]+"""
        ),
        rf"\1\2{MASK}",
    ),
    (re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.\-]*://[^:/\s@]*:)[^@\s/]+@"), rf"\1{MASK}@"),
)

# Every pattern above needs one of these in the text (compared lower-cased): a text without any of them is
# left as it is without running the patterns (most log lines: an access log line, a job's event).
_MARKERS = ("bearer", "rlx", "rjt", "rjb", "rjd", "rlc", "authorization", "relax_", "ray_", "://")

_registered: set[str] = set()
_lock = threading.Lock()
MIN_REGISTERED_LEN = 8  # shorter values would mask ordinary words


def register_secret(value: str | bytes | None) -> None:
    """Mask this exact value from now on in this process (e.g. the signing key, Ray's auth token)."""
    if isinstance(value, bytes):
        value = value.decode(errors="ignore")
    value = (value or "").strip()
    if len(value) >= MIN_REGISTERED_LEN:
        with _lock:
            _registered.add(value)


def redact(text: str) -> str:
    """`text` with every secret replaced by `[redacted]`."""
    if not text:
        return text
    lowered = text.lower()
    if any(marker in lowered for marker in _MARKERS):
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
    if _registered:
        with _lock:
            values = sorted(_registered, key=len, reverse=True)
        for value in values:
            if value in text:
                text = text.replace(value, MASK)
    return text


def redact_value(value: Any) -> Any:
    """Strings redacted, lists/tuples/dicts walked (keys kept), anything else as it is."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v) for v in value)
    return value


def _redact_arg(arg: Any) -> Any:
    if isinstance(arg, str):
        return redact(arg)
    if arg is None or isinstance(arg, int | float | bool):
        return arg
    try:
        text = str(arg)
    except Exception:  # noqa: BLE001 - a broken __str__ is the formatter's problem, not ours
        return arg
    clean = redact(text)
    return arg if clean == text else clean  # keep the object (and %d/%r formats) when nothing leaks


def redact_record(record: logging.LogRecord) -> None:
    """Redact a log record in place: its message, its arguments, its exception text."""
    if isinstance(record.msg, str):
        record.msg = redact(record.msg)
    elif record.msg is not None and not isinstance(record.msg, int | float):
        record.msg = _redact_arg(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(_redact_arg(a) for a in record.args)
    elif isinstance(record.args, dict):
        record.args = {k: _redact_arg(v) for k, v in record.args.items()}
    if record.exc_info and not record.exc_text:
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
    elif record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class RedactingFilter(logging.Filter):
    """For a handler that must redact whatever reaches it (the record factory covers loggers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def install_log_redaction() -> None:
    """Redact every log record this process creates, whichever logger and handler (uvicorn's access log,
    Celery's, Ray's, ours), and mask the values of the secret environment variables. Idempotent."""
    for name, value in os.environ.items():
        if SECRET_ENV_NAME.match(name):
            register_secret(value)
    current = logging.getLogRecordFactory()
    if getattr(current, "_relax_redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = current(*args, **kwargs)
        try:
            redact_record(record)
        except Exception:  # noqa: BLE001 - logging must never break the caller
            pass
        return record

    factory._relax_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
