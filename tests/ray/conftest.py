"""Fixtures for tests on a real local Ray: offline tiny model and datasets, and a fake platform API."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

# tests/conftest.py gives every test cluster token auth with a token of the session (never ~/.ray).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


# One private local Ray for every test that uses `ray_local`, one module after another: the driver reuses a
# connection it finds (and leaves it up), which saves ~8 s of start and stop per run, and the modules share it
# as the end-to-end modules share their platform (tests/e2e/conftest.py): it stops when the next test on this
# worker does not use it (pytest's `nextitem`), since other modules start a Ray of their own (a cluster, a head
# with a fake GPU) on the same default ports. tests/conftest.py runs the tests that use it next to each other
# in their lane, so it starts once there instead of once per module: a start takes 3.5-10 s (load 1-6) and a
# stop ~1.4 s, while the next module's first test on the warm Ray took ~1 s longer (2026-12-07, load 1-3:
# eval_only + sglang_engine_actor 30.9 s -> 26.5 s, mean of 2 and 3 runs; five modules 121.5/92.6 s ->
# 107.6/88.8 s).
RAY_FIXTURE = "ray_local"
_NEXT: dict[str, pytest.Item | None] = {}
_OURS: dict[str, bool] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _NEXT["item"] = nextitem  # read by ray_local's teardown below, which runs inside this hook's call


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A private local Ray of 6 CPUs, up from the first test that uses it until the next test on this worker
    does not (shared with the modules in between)."""
    import ray

    if not (_OURS.get("up") and ray.is_initialized()):
        ray.init(address="local", num_cpus=6, include_dashboard=False, logging_level="WARNING")
        _OURS["up"] = True
    try:
        yield
    finally:
        nextitem = _NEXT.pop("item", None)
        if nextitem is None or RAY_FIXTURE not in getattr(nextitem, "fixturenames", ()):
            _OURS.pop("up", None)
            ray.shutdown()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model, the arithmetic datasets, and an SFT-warmed copy of the model trained in-process
    (no Ray, as sft-arith.yaml does): the starting point the RL tests improve on."""
    from runtime.data.arith import write_datasets
    from runtime.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("artifacts")
    model = build_tiny_model(root / "tiny", seed=0)
    data = write_datasets(root / "arith", seed=0)
    warm = warm_start(model, data["sft"], root / "warm")
    # 16 prompts seen every step: RL sharpens them within tens of steps (the 100-prompt demo takes ~250)
    small = root / "arith" / "train_small.jsonl"
    small.write_text("".join(data["train"].read_text().splitlines(keepends=True)[:16]))
    return {"model": model, "warm": warm, "train_small": small, **data}


def warm_start(model: Path, sft_data: Path, out: Path, steps: int = 60) -> Path:
    import torch
    from transformers import AutoTokenizer

    from runtime.data.prompts import DatasetConfig, PromptCursor, PromptFormatter, read_prompt_items
    from runtime.data.sft import SFTExampleBuilder
    from runtime.devices import Device
    from runtime.train.schedule import LRSchedule
    from runtime.train.torch_backend import TorchTrainBackend, TrainConfig
    from runtime.types import RolloutBatch

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model)
    config = DatasetConfig(input_key="input", label_key="output")
    source = PromptCursor(read_prompt_items(sft_data, config), shuffle=True, seed=0)
    builder = SFTExampleBuilder(PromptFormatter(tok, config), label_key="output")
    backend = TorchTrainBackend(
        str(model),
        TrainConfig(loss_type="sft", lr_schedule=LRSchedule(lr=3e-3), micro_batch_size=32, weight_decay=0.0),
        device=Device.detect(),
    )
    for _ in range(steps):
        items = source.next_prompts(32)
        backend.train_step(
            RolloutBatch.from_samples([builder.build(it, i) for i, it in enumerate(items)], tok.pad_token_id)
        )
    backend.export_hf(str(out), steps)
    return out


def read_metrics(report_dir: Path) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    for line in (report_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        series.setdefault(row["name"], {})[row["step"]] = row["value"]
    return series


def read_reports(report_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (report_dir / "reports.jsonl").read_text().splitlines()]


class FakePlatform:
    """The platform's internal job API as the driver sees it (real HTTP): POST token (the bootstrap
    secret for the attempt's token, once), GET spec, POST report."""

    def __init__(
        self, spec: dict[str, Any], token: str, stop_after_step: int | None = None, attempt: int = 1
    ) -> None:
        self.spec = spec
        self.token = token
        self.bootstrap = f"rjb_{attempt}_bootstrap-of-{token}"
        self.attempt = attempt
        self.exchanges = 0  # tries, the refused ones included
        self.stop_after_step = stop_after_step
        self.reports: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def items(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [item for report in self.reports for item in report[kind]]

    def handler(self) -> type[BaseHTTPRequestHandler]:
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, body: dict[str, Any]) -> None:
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {platform.token}":
                    self._reply(401, {"error": {"code": "auth"}})
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if self._authorized() and self.path.endswith("/spec"):
                    self._reply(200, {"spec": platform.spec})

            def do_POST(self) -> None:  # noqa: N802
                if self.path.endswith("/token"):
                    with platform.lock:
                        platform.exchanges += 1
                        first = platform.exchanges == 1
                    if self.headers.get("Authorization") != f"Bearer {platform.bootstrap}":
                        self._reply(401, {"error": {"code": "job.bad_token"}})
                    elif not first:
                        self._reply(409, {"error": {"code": "job.bootstrap_reused"}})
                    else:
                        self._reply(200, {"token": platform.token, "attempt": platform.attempt})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self._authorized():
                    return
                with platform.lock:
                    platform.reports.append(body)
                    progress = [r["progress"]["step"] for r in platform.reports if r.get("progress")]
                stop = (
                    platform.stop_after_step is not None
                    and max(progress, default=0) >= platform.stop_after_step
                )
                self._reply(200, {"stop_requested": stop})

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def fake_platform() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(
        spec: dict[str, Any], token: str, stop_after_step: int | None = None, attempt: int = 1
    ) -> tuple[FakePlatform, str]:
        platform = FakePlatform(spec, token, stop_after_step, attempt)
        server = ThreadingHTTPServer(("127.0.0.1", 0), platform.handler())
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return platform, f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
