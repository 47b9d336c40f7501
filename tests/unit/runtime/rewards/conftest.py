"""Fixtures for the reward tests: a real local HTTP reward server, and user hook modules written to disk."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


def grade(body: dict[str, Any]) -> dict[str, Any]:
    """The test server's reward for one sample: exact match, plus the response length for logging."""
    return {"score": 1.0 if body["response"] == body["label"] else 0.0, "length": len(body["response"])}


class RewardServer:
    """A reward model over real HTTP (stdlib `ThreadingHTTPServer`, a thread per request, free port).

    The first `fail_first` requests get `fail_status`; the first `hang_first` requests sleep `hang_s` before
    answering (to trip client timeouts); every request sleeps `delay_s` (to make concurrency observable).
    `answer(body)` makes the reply of a successful request. `requests` keeps every body received and
    `max_in_flight` the most requests being handled at once.
    """

    def __init__(self) -> None:
        self.fail_first = 0
        self.fail_status = 503
        self.hang_first = 0
        self.hang_s = 0.0
        self.delay_s = 0.0
        self.answer: Callable[[dict[str, Any]], Any] = self.default_answer
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._httpd.handle_error = lambda request, address: None  # clients that time out close early
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/score"

    @staticmethod
    def default_answer(body: dict[str, Any]) -> Any:
        if "samples" in body:
            return [grade(sample) for sample in body["samples"]]
        return grade(body)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with server._lock:
                    server.requests.append(body)
                    number = len(server.requests)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay_s + (server.hang_s if number <= server.hang_first else 0.0))
                    if number <= server.fail_first:
                        status, payload = server.fail_status, {"error": "try again"}
                    else:
                        status, payload = 200, server.answer(body)
                finally:
                    # done before the answer leaves: once the client has it, it may send its next request, which
                    # another thread may count before this one would get here after writing (a loaded machine
                    # then saw 4 in flight under a limit of 3)
                    with server._lock:
                        server.in_flight -= 1
                self._reply(status, payload)

            def _reply(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler


@pytest.fixture
def rm_server() -> Iterator[RewardServer]:
    server = RewardServer()
    yield server
    server.close()


USER_HOOKS = '''
"""User reward hooks, as a job would ship them."""
import asyncio


def by_length(sample):
    return float(len(sample.response))


async def relax_style(args, sample):
    await asyncio.sleep(0)
    return {"acc": float(sample.response == sample.label), "bonus": args.my_bonus}


_SESSION = {}


async def cached_session(args, sample):
    # Relax-style hooks cache loop-bound clients at module level: the loop must outlive one batch
    loop = asyncio.get_running_loop()
    return 1.0 if _SESSION.setdefault("loop", loop) is loop else 0.0


def group_rank(args, samples):
    return [float(rank) for rank in range(len(samples))]


async def group_async(samples):
    return [{"score": float(s.response == s.label)} for s in samples]


def short_group(args, samples):
    return [1.0]


def post_process(args, samples):
    raw = [s.reward for s in samples]
    return raw, [r * 10 for r in raw]


def post_process_list(args, samples):
    return [args.n_samples_per_prompt] * len(samples)


def writes_args(args, sample):
    args.rm_type = "math"
    return 1.0


def boom(sample):
    raise RuntimeError("kaput")


NOT_A_FUNCTION = 3
'''


@pytest.fixture(scope="session")
def hooks_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The importable name of a module of user hooks written into a temporary folder on sys.path."""
    folder = tmp_path_factory.mktemp("user_hooks")
    name = f"user_rewards_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(USER_HOOKS, encoding="utf-8")
    sys.path.insert(0, str(folder))
    yield name
    sys.path.remove(str(folder))
    sys.modules.pop(name, None)
