"""Actor logs reach the platform: role actors hand their log records (exceptions included) to a sink
actor, and the driver relays them into its reporter, tagged `actor:<role>`.

Inside an actor, records of the `runtime` loggers at INFO and above and every other logger's warnings
go to the sink without blocking (fire-and-forget calls, kept in order per actor). A method of a role actor
that raises logs the exception with its traceback first (`log_exceptions`), so the failure is readable
where it happened, not only as the driver's `RayTaskError`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import ray
from ray.actor import ActorHandle

# the driver's side only (LogRelay): the sink's process and the role actors' leave the reporter (pydantic,
# httpx, the spool) unimported
if TYPE_CHECKING:
    from runtime.reporter import Reporter

MAX_BUFFERED = 20_000  # records kept in the sink between drains; the oldest go first
T = TypeVar("T")

log = logging.getLogger(__name__)


class LogSink:
    """A Ray actor (no CPU) collecting log records from every role actor until the driver drains them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.dropped = 0

    def put(self, items: list[dict[str, Any]]) -> None:
        self.items.extend(items)
        if len(self.items) > MAX_BUFFERED:
            excess = len(self.items) - MAX_BUFFERED
            del self.items[:excess]
            self.dropped += excess

    def drain(self) -> list[dict[str, Any]]:
        items, self.items = self.items, []
        if self.dropped:
            items.append(_item("WARNING", f"{self.dropped} actor log lines dropped", "actor", time.time()))
            self.dropped = 0
        return items


def _item(level: str, message: str, source: str, when: float) -> dict[str, Any]:
    return {"level": level, "message": message, "source": source, "time": when}


class _ActorFilter(logging.Filter):
    """`runtime.*` records from INFO, anything else from WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        floor = logging.INFO if record.name.startswith("runtime") else logging.WARNING
        return record.levelno >= floor


class ActorLogHandler(logging.Handler):
    """Sends each record (formatted, traceback included) to the sink without waiting."""

    def __init__(self, sink: ActorHandle, source: str) -> None:
        super().__init__(logging.INFO)
        self.sink = sink
        self.source = source
        self.addFilter(_ActorFilter())

    _busy = threading.local()  # Ray may log while we submit: never recurse into ourselves

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._busy, "on", False):
            return
        self._busy.on = True
        try:
            message = f"{record.name}: {record.getMessage()}"
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self.sink.put.remote([_item(record.levelname, message, self.source, record.created)])
        except Exception:  # noqa: BLE001 - logging must never break the caller
            self.handleError(record)
        finally:
            self._busy.on = False


def install_actor_logging(sink: ActorHandle | None, source: str) -> None:
    """Called first thing in a role actor's constructor."""
    if sink is None:
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, ActorLogHandler):
            root.removeHandler(handler)
    root.addHandler(ActorLogHandler(sink, source))
    root.setLevel(min(root.level or logging.WARNING, logging.INFO))
    logging.getLogger("runtime").setLevel(logging.INFO)
    try:  # transformers logs through a handler of its own: route its warnings to ours instead
        import transformers

        transformers.utils.logging.disable_default_handler()
        transformers.utils.logging.enable_propagation()
    except ImportError:  # pragma: no cover - the runtime extra always installs it
        pass


def log_exceptions(cls: type[T]) -> type[T]:
    """Class decorator: every public method, inherited ones included, logs an exception (with traceback)
    before re-raising it."""
    for name in dir(cls):
        member = getattr(cls, name)
        if (
            name.startswith("_")
            or not inspect.isfunction(member)
            or getattr(member, "_logs_exceptions", False)
        ):
            continue
        setattr(cls, name, _logged(cls.__name__, name, member))
    return cls


def _logged(owner: str, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    logger = logging.getLogger(f"runtime.roles.{owner}")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:
            logger.exception("%s.%s failed", owner, name)
            raise

    wrapper._logs_exceptions = True  # type: ignore[attr-defined]
    return wrapper


class LogRelay:
    """Driver side: a thread moving the sink's records into the reporter every `interval` seconds."""

    def __init__(self, sink: ActorHandle, reporter: Reporter, *, interval: float = 0.5) -> None:
        self.sink = sink
        self.reporter = reporter
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="actor-log-relay", daemon=True)
        self._thread.start()

    def drain(self) -> int:
        try:
            items = ray.get(self.sink.drain.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the sink dies with the job; never fail the driver for logs
            return 0
        for item in items:
            self.reporter.log(item["level"], item["message"], source=item["source"], when=item["time"])
        return len(items)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.drain()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.drain()


def start_log_sink() -> ActorHandle:
    return ray.remote(num_cpus=0)(LogSink).remote()
