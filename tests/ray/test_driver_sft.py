"""SFT through the driver on a real local Ray, in platform mode: HTTP reports, stop, resume, HF export; and
against the real API, an outage of the API during training that loses no report."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import torch
import uvicorn

from api.app import create_app
from runtime import driver
from runtime.reporter import Reporter
from runtime.spool import spool_dir
from scheduler.db.engine import Database
from scheduler.db.migrate import upgrade
from scheduler.db.models import Checkpoint, Job, Metric
from scheduler.services.job_tokens import bootstrap_secret
from scheduler.services.lifecycle import JobLifecycle
from scheduler.services.paths import team_area
from scheduler.services.reports import JobReports
from scheduler.settings import ApiSettings, DatabaseSettings, Settings
from tests.factories import bootstrap, make_job
from tests.ray.conftest import read_reports

pytestmark = pytest.mark.ray


def sft_spec(artifacts: dict[str, Path], out: Path) -> dict:
    """A normalized spec as the platform sends it: underscore names (the platform fills every default)."""
    from runtime.spec import load_spec

    raw = {
        "train_backend": "torch",
        "hf_checkpoint": str(artifacts["model"]),
        "prompt_data": str(artifacts["sft"]),
        "input_key": "input",
        "label_key": "output",
        "loss_type": "sft",
        "rollout_shuffle": True,
        "rollout_batch_size": 32,
        "global_batch_size": 32,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "num_rollout": 200,
        "lr": 3e-3,
        "lr_decay_style": "constant",
        "weight_decay": 0.0,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
        "save": str(out / "ckpt"),
        "save_interval": 100,
        "save_hf": str(out / "hf"),
    }
    return load_spec(raw).values()  # through jobspec when available: every field, defaults applied


def test_sft_reports_stops_on_request_and_resumes(
    ray_local, artifacts: dict[str, Path], tmp_path: Path, fake_platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = sft_spec(artifacts, tmp_path)
    platform, url = fake_platform(spec, token="rjt_1_job-token", stop_after_step=25)
    monkeypatch.setenv("RELAX_JOB_BOOTSTRAP", platform.bootstrap)
    assert driver.main(["--job-id", "job_sft", "--api-url", url]) == 0
    # one exchange, and neither the bootstrap secret nor the token is left in the environment
    assert platform.exchanges == 1
    assert "RELAX_JOB_BOOTSTRAP" not in os.environ
    assert not any("job-token" in v for v in os.environ.values())

    # The platform asked for a stop after step 25: the driver saved there and left cleanly.
    assert [r["phase"] for r in platform.reports if r["phase"]] == ["running"]
    assert all(r["attempt"] == 1 for r in platform.reports)
    seqs = [r["seq"] for r in platform.reports]
    assert seqs == list(range(len(seqs)))
    stopped_at = int((tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text())
    assert 24 <= stopped_at < 199
    checkpoints = platform.items("checkpoints")
    assert {c["format"] for c in checkpoints} == {"torch", "hf"}
    assert all(c["step"] == stopped_at and c["size_bytes"] > 0 for c in checkpoints)
    kinds = [e["kind"] for e in platform.items("events")]
    assert "model_loaded" in kinds and "stop_requested" in kinds and "finished" not in kinds
    assert any("stop requested" in line["message"] for line in platform.items("logs"))
    losses = {m["step"]: m["value"] for m in platform.items("metrics") if m["name"] == "train/loss"}
    assert losses[stopped_at] < losses[0] * 0.5
    assert {"train/grad_norm", "train/lr", "perf/train_time", "perf/step_time", "perf/tokens_per_s"} <= {
        m["name"] for m in platform.items("metrics")
    }

    # The HF export is a model another job can use as hf-checkpoint.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    prompt = tok("1+2=", add_special_tokens=False)["input_ids"]
    out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert tok.decode(out[0, len(prompt) :]).startswith("\\boxed{")

    # A retry (standalone here) with load = save picks up at the next step and runs to the end.
    resumed = dict(spec, load=str(tmp_path / "ckpt"), num_rollout=stopped_at + 4)
    spec_file = tmp_path / "resume.json"
    spec_file.write_text(json.dumps(resumed))
    assert driver.main(["--spec-file", str(spec_file), "--report-dir", str(tmp_path / "report2")]) == 0
    reports = read_reports(tmp_path / "report2")
    steps = sorted({m["step"] for r in reports for m in r["metrics"]})
    assert steps == list(range(stopped_at + 1, stopped_at + 4))
    assert any(e["kind"] == "resumed" for r in reports for e in r["events"])
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == str(
        stopped_at + 3
    )


def test_sft_on_conversations_with_holdout_perplexity_and_predictions(
    ray_local, artifacts: dict[str, Path], tmp_path: Path, fake_platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ShareGPT conversations (key map, system prompt, tools), eval-size holdout, perplexity every
    eval-interval steps, predictions every sft-predict-interval steps, oversize rows truncated.

    The predictions' engine is the built-in one in a rollout actor of its own (`RELAX_ROLLOUT_ENGINE=
    in-process`), not a server the actor starts: SFT predictions through an engine server are
    tests/e2e/test_pipeline_features.py's (through the platform), and the server costs a process that imports
    torch and loads the model (its actor and server took 6.0 + 5.0 s of CPU, the in-process actor 6.8 s)."""
    from runtime.data.arith import SHAREGPT_KEY_MAP
    from runtime.spec import load_spec

    raw = {
        "train_backend": "torch",
        "hf_checkpoint": str(artifacts["model"]),
        "prompt_data": str(artifacts["sft_chat"]),
        "input_key": "conversations",
        "conversation_key_map": SHAREGPT_KEY_MAP,
        "system_prompt": "Answer in \\boxed{}.",
        "tool_key": "tools",
        "loss_type": "sft",
        "rollout_shuffle": True,
        "rollout_batch_size": 16,
        "global_batch_size": 16,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 64,
        "sft_oversize_strategy": "truncate_left",
        "num_rollout": 20,
        "lr": 3e-3,
        "lr_decay_style": "constant",
        "weight_decay": 0.0,
        "eval_size": 0.1,
        "eval_interval": 10,
        "sft_predict_interval": 20,
        "eval_max_response_len": 8,
        "eval_temperature": 0.0,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
        "save": str(tmp_path / "ckpt"),
    }
    spec = load_spec(raw).values()
    platform, url = fake_platform(spec, token="tok", attempt=0)
    monkeypatch.setenv("RELAX_JOB_BOOTSTRAP", platform.bootstrap)
    monkeypatch.setenv("RELAX_ROLLOUT_ENGINE", "in-process")
    assert driver.main(["--job-id", "job_chat", "--api-url", url]) == 0

    metrics: dict[str, dict[int, float]] = {}
    for m in platform.items("metrics"):
        metrics.setdefault(m["name"], {})[m["step"]] = m["value"]
    assert sorted(metrics["eval/loss"]) == [10, 20] and metrics["eval/loss"][20] < metrics["eval/loss"][10]
    assert metrics["eval/ppl"][20] == pytest.approx(2.718281828 ** metrics["eval/loss"][20], rel=1e-6)
    assert metrics["eval/num_tokens"][10] > 0 and "perf/sft_predict_time" in metrics
    (prediction,) = platform.items("predictions")
    path = Path(prediction["path"])
    assert path == tmp_path / "ckpt" / "predict" / "predictions_step_19.jsonl" and prediction["step"] == 19
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == prediction["num_samples"] == 10  # 10% of 100 conversations held out
    assert all(set(r) == {"prompt", "reference", "completion"} for r in rows)
    assert rows[0]["prompt"].endswith("<|im_start|>assistant\n") and rows[0]["reference"].startswith(
        "\\boxed{"
    )
    logs = platform.items("logs")
    assert any(
        "capacity 64: truncate_left" in line["message"] for line in logs
    )  # logged where the samples are built
    assert any(line["source"].startswith("actor:") for line in logs)  # actor logs reach the platform


# -- the outage (docs/reliability.md) ---------------------------------------------------------------
# The API goes away while the driver trains (its process is gone: the uvicorn server stops) and comes back on
# the same port later. The driver keeps training, spools what it cannot send on disk and delivers it when the
# API is back: every metric point it produced is stored exactly once, its checkpoint registrations arrive,
# and its final report is stored. Real driver, real API (uvicorn, SQLite); it shares this module's Ray.
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _NoDispatch:
    def request_pass(self) -> None: ...
    def launch(self, job_id: str, pool: str) -> None: ...
    def stop(self, job_id: str, pool: str) -> None: ...
    def reconcile(self, pool: str) -> None: ...


class Api:
    """The real API (uvicorn, SQLite) on a fixed port, stopped and started again like a killed process."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings, self.db = settings, db
        self.server: uvicorn.Server | None = None
        self.admin_key = ""
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        app = create_app(self.settings, db=self.db, dispatcher=_NoDispatch())
        config = uvicorn.Config(app, host="127.0.0.1", port=self.settings.api.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.server.started

    def stop(self) -> None:
        assert self.server is not None and self.thread is not None
        self.server.should_exit = True
        self.thread.join(15)
        self.server = None


@pytest.fixture
def live_api(tmp_path: Path) -> Iterator[Api]:
    home = tmp_path / "home"
    settings = Settings(
        home=home,
        database=DatabaseSettings(url=f"sqlite:///{home / 'relax.db'}"),
        api=ApiSettings(host="127.0.0.1", port=free_port()),
    )
    home.mkdir()
    upgrade(settings.database_url)
    db = Database(settings.database_url)
    admin_key = bootstrap(db, home)
    api = Api(settings, db)
    api.admin_key = admin_key
    api.start()
    yield api
    if api.server is not None:
        api.stop()
    db.dispose()


def _sft_job(api: Api, artifacts: dict[str, Path]) -> str:
    """A STARTING SFT job (attempt 1) whose inputs are in its team's area, as submission would leave it."""
    from runtime.spec import load_spec

    settings, db = api.settings, api.db
    job_id = make_job(db, artifact_root=settings.artifacts)
    with db.session() as s:
        job = s.get(Job, job_id)
        area = team_area(settings.artifacts, job.team_id)
        shutil.copytree(artifacts["model"], area / "tiny")
        shutil.copy(artifacts["sft"], area / "sft.jsonl")
        raw = {
            "train_backend": "torch",
            "hf_checkpoint": str(area / "tiny"),
            "prompt_data": str(area / "sft.jsonl"),
            "input_key": "input",
            "label_key": "output",
            "loss_type": "sft",
            "rollout_batch_size": 32,
            "global_batch_size": 32,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 4096,
            "num_rollout": 60,
            "lr": 3e-3,
            "resource": {"actor": [1, 1], "rollout": [1, 1]},
            "save": str(Path(job.output_dir) / "ckpt"),
            "save_interval": 30,
        }
        job.spec = load_spec(raw).values()
        svc = JobLifecycle(s)
        for src, dst in (("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING")):
            assert svc.transition(job_id, dst, expected_from=src, reason="test")
    return job_id


def test_the_api_dies_and_returns_and_every_report_of_the_driver_arrives_once(
    ray_local, artifacts: dict[str, Path], live_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _sft_job(live_api, artifacts)
    produced: list[tuple[int, str, float]] = []
    original = Reporter.metrics

    def counting(self: Reporter, step: int, values: dict[str, float]) -> None:
        produced.extend((step, name, float(value)) for name, value in values.items())
        original(self, step, values)

    monkeypatch.setattr(Reporter, "metrics", counting)
    monkeypatch.setenv("RELAX_JOB_BOOTSTRAP", bootstrap_secret(live_api.settings.signing_key(), job_id, 1))
    with live_api.db.session() as s:
        output_dir = s.get(Job, job_id).output_dir
    spool = spool_dir(output_dir, 1)
    seen: dict[str, Any] = {}

    def outage() -> None:
        """Kill the API once the driver's first report is stored; bring it back once the driver has trained
        20 steps into the spool."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with live_api.db.session(read_only=True) as s:
                if s.get(Job, job_id).report_seq >= 0:
                    break
            time.sleep(0.05)
        live_api.stop()
        seen["down_at_seq"] = len(produced)
        while time.monotonic() < deadline and len({p[0] for p in produced}) < 20:
            time.sleep(0.05)
        seen["spooled_bytes"] = sum(f.stat().st_size for f in spool.glob("seg-*.jsonl"))
        seen["steps_while_down"] = len({p[0] for p in produced})
        live_api.start()

    controller = threading.Thread(target=outage, daemon=True)
    controller.start()
    assert driver.main(["--job-id", job_id, "--api-url", live_api.settings.public_url]) == 0
    controller.join(30)

    assert seen["down_at_seq"] == 0  # the API died before any metric: all of them went through the outage
    assert seen["steps_while_down"] >= 20 and seen["spooled_bytes"] > 0  # trained on, spooled on disk
    with live_api.db.session() as s:
        job = s.get(Job, job_id)
        stored = [
            (m.step, m.name, m.value) for m in s.scalars(sa.select(Metric).where(Metric.job_id == job_id))
        ]
        checkpoints = sorted(s.scalars(sa.select(Checkpoint.step).where(Checkpoint.job_id == job_id)))
        final = JobReports(s).final_report_stored(job)
        assert job.status == "RUNNING" and job.progress_step == 60
    assert len(produced) > 60 * 3
    assert sorted(stored) == sorted(produced)  # every point the driver produced, exactly once
    assert checkpoints == [29, 59]
    assert final
    assert not spool.exists()  # all acknowledged
    # --use-tensorboard (on by default): the job's event files, under its output folder (its artifacts), hold
    # exactly the points the API stored, as TensorBoard reads them back (float32)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with live_api.db.session() as s:
        tb_dir = Path(output_dir) / "tensorboard" / s.get(Job, job_id).name
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    written = {(e.step, tag): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    assert written == pytest.approx({(step, name): value for step, name, value in stored}, rel=1e-6)
    # ... and the API serves them as the job's artifacts
    (events,) = tb_dir.iterdir()
    served = httpx.get(
        f"{live_api.settings.public_url}/v1/jobs/{job_id}/artifacts/{events.relative_to(output_dir)}",
        headers={"Authorization": f"Bearer {live_api.admin_key}"},
    )
    assert served.status_code == 200 and served.content == events.read_bytes()
