"""Job files as users bring them: job envelopes, bare Relax configs, Relax launch scripts."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.jobfile import JobFileError, load_job_file
from client.launch_script import LaunchScriptError

ROOT = Path(__file__).resolve().parents[3]


def test_examples_are_job_envelopes() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        jf = load_job_file(path)
        assert jf.name and jf.spec, path


def test_a_bare_config_is_the_spec(tmp_path: Path) -> None:
    f = tmp_path / "bare.yaml"
    f.write_text("rollout-batch-size: 8\nlr: 1.0e-6\n")
    assert load_job_file(f).spec == {"rollout-batch-size": 8, "lr": 1e-6}


def test_unknown_envelope_keys_are_named(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("name: x\nspec: {lr: 1}\nprioriti: 3\n")
    with pytest.raises(JobFileError, match="prioriti"):
        load_job_file(f)


def test_a_launch_script_gives_its_flags(tmp_path: Path) -> None:
    """bash runs the script here; its training command's flags are the job's args."""
    f = tmp_path / "run-grpo.sh"
    f.write_text(
        "#!/bin/bash\nset -u\nMODEL=${MODEL_DIR}/tiny\nROLLOUT_ARGS=(\n  --rollout-batch-size 4  # per round\n"
        "  --n-samples-per-prompt 4\n)\n"
        'python3 train.py \\\n  --hf-checkpoint $MODEL \\\n  "${ROLLOUT_ARGS[@]}" --colocate \\\n'
        '  --resource \'{"actor": [1, 1]}\' "$@"\n'
    )
    jf = load_job_file(f, script_env={"MODEL_DIR": "/models"}, script_args=["--seed", "3"])
    assert jf.name == "run-grpo"
    assert jf.args == [
        "--hf-checkpoint",
        "/models/tiny",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--colocate",
        "--resource",
        '{"actor": [1, 1]}',
        "--seed",
        "3",
    ]
    assert jf.launch_script is not None and jf.launch_script.line == 8
    assert jf.launch_script.provenance()["env"] == {"MODEL_DIR": "/models"}
    with pytest.raises(LaunchScriptError, match="MODEL_DIR: unbound variable"):
        load_job_file(f)  # the variable is not given: bash says which
