"""SFT through the driver on a real local Ray, in platform mode: HTTP reports, stop, resume, HF export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime import driver
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
    artifacts: dict[str, Path], tmp_path: Path, fake_platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = sft_spec(artifacts, tmp_path)
    platform, url = fake_platform(spec, token="job-token", stop_after_step=25)
    monkeypatch.setenv("RELAX_JOB_TOKEN", "job-token")
    monkeypatch.setenv("RELAX_JOB_ATTEMPT", "1")
    assert driver.main(["--job-id", "job_sft", "--api-url", url]) == 0

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
