"""`tools/check_launch_scripts.py` over the launch-script fixtures: each script resolved by bash, its argv
normalized by the job spec, then checked against what its backend (megatron, Relax's default) runs, as
submission would. The Qwen3-4B SFT script runs as it is; the others are refused only by the parameters named
here, which is what the backend does not implement yet (docs/reference/capabilities.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.check_launch_scripts import check, main

SCRIPTS = (
    Path(__file__).resolve().parents[2] / "fixtures" / "launch_scripts" / "relax" / "scripts" / "training"
)

# what the megatron backend refuses in each script today (spec.unsupported_by_backend), by flag
REFUSED = {
    "run-qwen3-4B-sft-exec.sh": [],
    # the rollout engines' tensor parallelism is SGLang's (GPU only)
    "run-qwen3-4B-grpo.sh": ["--rollout-num-gpus-per-engine=2"],
    # Relax's legacy layout flags size the roles (rule.legacy_layout_resource), grouped GEMM and permute fusion
    # run without TransformerEngine: only the engines' tensor parallelism is left
    "run-qwen3-30B-A3B-async.sh": ["--rollout-num-gpus-per-engine=4"],
}


@pytest.mark.parametrize("script", sorted(REFUSED))
def test_the_fixture_scripts_pass_or_are_refused_by_name(script: str) -> None:
    result = check(SCRIPTS / script, {})
    refused = [reason.split(") ", 1)[1] for reason in result["reasons"]]
    assert refused == REFUSED[script], result
    assert result["ok"] is (not REFUSED[script])
    assert result["stage"] == ("valid" if result["ok"] else "backend"), result


def test_the_table_names_the_backend_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(SCRIPTS), "--glob", "run-qwen3-*.sh"]) == 1
    out = capsys.readouterr().out
    assert "ok              " in out and "FAIL (backend)" in out
    assert "1/3 scripts valid" in out
    assert "spec.unsupported_by_backend (megatron) --rollout-num-gpus-per-engine=2" in out
