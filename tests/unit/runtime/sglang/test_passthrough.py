"""The job spec's `--sglang-*` arguments are read, not refused: they reach every engine server's command line
(real SGLang's verbatim, the built-in engine's, which reads what it implements), except the flags the
platform sets itself and names that are no SGLang server flag, which validation refuses by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import jobspec
from runtime.capabilities import RESTRICTION_HINTS, unsupported_parameters
from runtime.pipeline import role_plan
from runtime.rollout.sglang import engine_actor
from runtime.rollout.sglang.engine_actor import (
    EngineLauncher,
    LaunchSpec,
    SGLangEngineActor,
    builtin_server_command,
    sglang_server_command,
)
from runtime.rollout.sglang.passthrough import RELAX_SGLANG_FLAGS, server_argv
from runtime.rollout.sglang.server_flags_sglang import SGLANG_SERVER_FLAGS, SGLANG_SWITCHES
from runtime.rollout.sglang.server_flags_sglang import __doc__ as flags_doc
from runtime.spec import load_spec, parameter_defaults

ROOT = Path(__file__).resolve().parents[4]
SGLANG_ARGV = [
    "--sglang-mem-fraction-static", "0.7",
    "--sglang-context-length", "4096",
    "--sglang-max-running-requests", "64",
    "--sglang-enable-dp-attention",
    "--sglang-cuda-graph-bs", "1", "2", "4",
    "--sglang-log-level=warning",
    "--sglang-router-ip", "10.0.0.1",  # Relax's own: not a server flag
    "--sglang-server-concurrency", "256",  # Relax's own
]  # fmt: skip
FORWARDED = [
    "--mem-fraction-static", "0.7",
    "--context-length", "4096",
    "--max-running-requests", "64",
    "--enable-dp-attention",
    "--cuda-graph-bs", "1", "2", "4",
    "--log-level", "warning",
]  # fmt: skip


def _job_values(extra_argv: list[str] = (), **overrides: Any) -> dict[str, Any]:
    """A valid torch-backend GRPO spec's normalized values, with `extra_argv` flags."""
    argv = [
        "--train-backend", "torch", "--hf-checkpoint", "/models/m", "--prompt-data", "/data/p.jsonl",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "8",
        "--num-rollout", "2", "--colocate", "--resource", '{"actor": [1, 1], "rollout": [1, 1]}',
        *extra_argv,
    ]  # fmt: skip
    values = jobspec.normalize(argv=argv).spec.to_dict()
    values.update(overrides)
    return values


def _defaults() -> dict[str, Any]:
    return parameter_defaults() or {}


def test_generated_flag_table_is_sglangs() -> None:
    assert "sglang 0.5.17" in flags_doc.lower() and "server_args.py" in flags_doc
    for flag in ("mem-fraction-static", "context-length", "max-running-requests", "cuda-graph-bs", "port"):
        assert flag in SGLANG_SERVER_FLAGS
    assert (
        SGLANG_SERVER_FLAGS["tensor-parallel-size"] == "tp_size" and "enable-dp-attention" in SGLANG_SWITCHES
    )
    assert not set(RELAX_SGLANG_FLAGS) & set(SGLANG_SERVER_FLAGS)


def test_server_argv_from_the_specs_mapping() -> None:
    values = _job_values(SGLANG_ARGV)
    assert values["sglang"]["cuda_graph_bs"] == [1, 2, 4] and values["sglang"]["enable_dp_attention"] is True
    assert list(server_argv(values["sglang"])) == FORWARDED
    # an object spec's off switch is left out, a switch given a word is bare
    assert server_argv(
        {"enable_dp_attention": False, "enable_metrics": "true", "disable_radix_cache": None}
    ) == ("--enable-metrics",)


def test_role_plan_carries_the_engine_arguments() -> None:
    spec = load_spec(_job_values(SGLANG_ARGV))
    assert list(role_plan(spec, 2).engine_args) == FORWARDED
    assert role_plan(load_spec(_job_values()), 2).engine_args == ()


@pytest.mark.parametrize("launcher", [sglang_server_command, builtin_server_command])
def test_engine_arguments_reach_the_launch_command(launcher: Any) -> None:
    spec = LaunchSpec("/models/m", "127.0.0.1", 30001, extra_args=tuple(FORWARDED), config_path="/tmp/c.yaml")
    command = launcher(spec)
    assert command[-len(FORWARDED) :] == FORWARDED  # verbatim, after the platform's flags
    platform = command[: -len(FORWARDED)]
    assert platform[platform.index("--port") + 1] == "30001" and platform[platform.index("--config") + 1] == (
        "/tmp/c.yaml"
    )


def test_the_engine_actor_puts_the_jobs_arguments_on_the_servers_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The built-in launcher's own --max-running-requests (the actor's batch size) yields to the job's."""
    commands: list[list[str]] = []

    class Exited:
        def __init__(self, command: list[str], **_: Any) -> None:
            commands.append(command)

        def poll(self) -> int:
            return 2

    monkeypatch.setattr(engine_actor.subprocess, "Popen", Exited)
    for args, batch in ((FORWARDED, "64"), (["--context-length", "128"], "256")):
        with pytest.raises(engine_actor.SGLangEngineError, match="server exited with 2"):
            SGLangEngineActor(
                "/models/m", engine_index=0, launcher="builtin", server_args=args, launch_attempts=1
            )
        command = commands[-1]
        assert command[command.index("--max-running-requests") + 1] == batch
        assert command.count("--max-running-requests") == 1
        assert all(word in command for word in args)
    with pytest.raises(engine_actor.SGLangEngineError):
        SGLangEngineActor(
            "/models/m",
            engine_index=0,
            launcher=EngineLauncher.SGLANG,
            server_args=FORWARDED,
            launch_attempts=1,
        )
    assert commands[-1][commands[-1].index("sglang.launch_server") + 1 :][-len(FORWARDED) :] == FORWARDED


def test_honoured_passthrough_is_not_refused() -> None:
    for backend in ("torch", "megatron"):
        values = _job_values(SGLANG_ARGV, train_backend=backend)
        assert not [p for p in unsupported_parameters(values, _defaults()) if p.startswith("sglang")]


@pytest.mark.parametrize(
    "argv,refused",
    [
        (["--sglang-port", "30000"], "sglang_port=30000"),
        (["--sglang-host", "0.0.0.0"], "sglang_host='0.0.0.0'"),
        (["--sglang-api-key", "k"], "sglang_api_key='k'"),
        (["--sglang-config", "/x.yaml"], "sglang_config='/x.yaml'"),
        (["--sglang-model-path", "/other"], "sglang_model_path='/other'"),
        (["--sglang-model", "/other"], "sglang_model='/other'"),
        (["--sglang-tp-size", "2"], "sglang_tp_size=2"),
        (["--sglang-tensor-parallel-size", "2"], "sglang_tensor_parallel_size=2"),
        (["--sglang-dp-size", "2"], "sglang_dp_size=2"),
        (["--sglang-no-such-flag", "1"], "sglang_no_such_flag"),
        # paths and ports would reach the engine verbatim, outside the team's confinement
        (["--sglang-tokenizer-path", "/other/team/tok"], "sglang_tokenizer_path='/other/team/tok'"),
        (["--sglang-download-dir", "/srv/relax"], "sglang_download_dir='/srv/relax'"),
        (["--sglang-crash-dump-folder", "/tmp/x"], "sglang_crash_dump_folder='/tmp/x'"),
        (["--sglang-grpc-port", "5000"], "sglang_grpc_port=5000"),
        (["--sglang-chat-template", "../../x.jinja"], "sglang_chat_template"),
    ],
)
def test_validation_refuses_platform_flags_and_non_sglang_names(argv: list[str], refused: str) -> None:
    values = _job_values(["--sglang-mem-fraction-static", "0.7", *argv])
    assert [p for p in unsupported_parameters(values, _defaults()) if p.startswith("sglang")] == [refused]


def test_submission_names_the_refused_flag() -> None:
    from scheduler.services.submission import backend_refusals

    issues = backend_refusals(_job_values(["--sglang-port", "30000", "--sglang-not-a-flag"]))
    by_field = {i["field"]: i for i in issues}
    assert set(by_field) == {"sglang-port", "sglang-not-a-flag"}
    port = by_field["sglang-port"]
    assert port["code"] == "spec.unsupported_by_backend" and port["message"].startswith("--sglang-port 30000")
    assert port["hint"] == "the platform picks the engine's port: remove --sglang-port"
    assert RESTRICTION_HINTS["sglang_host"] == "the platform picks the engine's address: remove --sglang-host"
    assert "remove --sglang-not-a-flag" in by_field["sglang-not-a-flag"]["hint"]
    confined = backend_refusals(_job_values(["--sglang-download-dir", "/srv/relax"]))
    assert [i["field"] for i in confined] == ["sglang-download-dir"]
    assert "outside the team's area" in confined[0]["hint"]
    # a built-in template name is not a path: forwarded
    assert backend_refusals(_job_values(["--sglang-chat-template", "chatml"])) == []
    # the dp size at 1 is what an engine of one GPU runs
    assert backend_refusals(_job_values(["--sglang-dp-size", "1", "--sglang-enable-dp-attention"])) == []


def test_launch_scripts_passing_sglang_flags_still_validate() -> None:
    """The Relax launch scripts of tests/fixtures that pass --sglang-* (quantization, mem-fraction-static):
    their spec validates, the capability check refuses none of their SGLang arguments, and the arguments
    reach the engines."""
    from client.launch_script import resolve_launch_script

    training = ROOT / "tests" / "fixtures" / "launch_scripts" / "relax" / "scripts" / "training"
    cases = [
        ("run-qwen3-4B-grpo.sh", {}, ["--mem-fraction-static", "0.7"]),
        ("run-qwen3-30B-A3B-async.sh", {"PRECISION": "fp8"}, ["--quantization", "fp8"]),
    ]
    for script, env, expected in cases:
        resolved = resolve_launch_script(training / script, env=env, script_args=[])
        assert any(w.startswith("--sglang-") for w in resolved.argv)
        values = jobspec.normalize(argv=resolved.argv).spec.to_dict()
        assert not [p for p in unsupported_parameters(values, _defaults()) if p.startswith("sglang")], script
        forwarded = list(server_argv(values["sglang"]))
        assert all(word in forwarded for word in expected), (script, forwarded)


def test_the_rollout_role_serves_with_the_jobs_arguments(tiny_model: Path) -> None:
    """HttpEngineActor (the `rollout` role, as `start_roles` makes it from `RolePlan.engine_args`) launches
    the built-in engine's server with the job's arguments: it reads --context-length and
    --max-running-requests, and names the others."""
    from runtime.roles.actors import HttpEngineActor

    args = (
        "--context-length",
        "64",
        "--max-running-requests",
        "4",
        "--enable-dp-attention",
        "--cuda-graph-bs",
        "1",
        "2",
    )
    actor = HttpEngineActor(str(tiny_model), engine_index=0, server_args=args)
    try:
        info = actor.server_info()
        assert (info["context_length"], info["max_batch_size"]) == (64, 4)
        assert "does not use: --enable-dp-attention, --cuda-graph-bs 1 2" in actor.log_tail()
    finally:
        actor.shutdown()
