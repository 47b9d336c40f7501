"""Launch scripts resolved by bash on the client (client/launch_script.py, docs/adr/0004).

The corpus under tests/fixtures/launch_scripts imitates a Relax checkout. Each training script is
resolved, and independently run by plain bash with PATH executables named python3/python/torchrun/
ray that write their argv as JSON (no shell functions, no capture stubs for them): both must see
the same commands with the same words.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jobspec
from client.launch_script import (
    TEXT_CAP,
    LaunchScriptError,
    ResolvedScript,
    _classify,
    is_secret_name,
    resolve_launch_script,
)
from jobspec.argv import decode_argv

ROOT = Path(__file__).resolve().parents[3]
TREE = ROOT / "tests" / "fixtures" / "launch_scripts" / "relax"
TRAINING = TREE / "scripts" / "training"
LOCAL_SH = TREE / "scripts" / "entrypoint" / "local.sh"

# (script, --env pairs, script args); every script runs at least twice with a different branch.
CORPUS = [
    ("run-qwen3-4B-grpo.sh", {}, ["--seed", "7"]),
    ("run-qwen3-4B-grpo.sh", {"ADVANTAGE_ESTIMATOR": "reinforce_plus_plus", "LOGGER": "wandb"}, []),
    ("run-qwen3-30B-A3B-async.sh", {}, []),
    ("run-qwen3-30B-A3B-async.sh", {"NUM_NODES": "2", "PRECISION": "fp8", "MODEL_ROOT": "/mnt/m"}, []),
    ("run-deepseek-v3-sft-torchrun.sh", {"NNODES": "8", "NODE_RANK": "3"}, ["--seed", "1"]),
    ("run-deepseek-v3-sft-torchrun.sh", {"PIPELINE_MP": "1", "MODE": "sample-mean"}, []),
    ("run-qwen3-4B-sft-exec.sh", {}, []),
    ("run-qwen3-4B-sft-exec.sh", {"EXP_NAME": "warmup", "DATA": "/d/x.parquet"}, ["--lr", "2e-5"]),
]
CORPUS_IDS = [f"{s}-{i}" for i, (s, _, _) in enumerate(CORPUS)]

_RECORDER = """#!{python}
import json, os, sys
with open(os.environ["ORACLE_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


@pytest.fixture(scope="module")
def oracle_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PATH executables for the oracle run: recorders for python/python3/torchrun/ray, and
    harmless stand-ins for what the corpus uses to clean up a machine."""
    bin_dir = tmp_path_factory.mktemp("oracle-bin")
    recorder = bin_dir / "record"
    recorder.write_text(_RECORDER.format(python=sys.executable))
    recorder.chmod(0o755)
    for name in ("python", "python3", "torchrun", "ray"):
        (bin_dir / name).symlink_to(recorder)
    for name, body in {
        "pkill": "exit 0",
        "sleep": "exit 0",
        "mkdir": "exit 0",
        "nvidia-smi": "exit 1",
        "tee": "exec cat",
    }.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_oracle(
    oracle_bin: Path, script: Path, env: dict[str, str], args: list[str], tmp: Path
) -> list[list[str]]:
    """Plain bash, same working directory, arguments and variables as the resolver gives."""
    log = tmp / "oracle.jsonl"
    (tmp / "home").mkdir(exist_ok=True)
    (tmp / "tmp").mkdir(exist_ok=True)
    run_env = {
        "PATH": f"{oracle_bin}:{os.environ['PATH']}",
        "HOME": str(tmp / "home"),
        "TMPDIR": str(tmp / "tmp"),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        "ORACLE_LOG": str(log),
        **env,
    }
    r = subprocess.run(
        ["bash", str(script), *args],
        cwd=script.parent,
        env=run_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def flags_after_target(words: list[str]) -> list[str]:
    """The oracle's view of the Relax flags: the words after the training module or script."""
    for i, w in enumerate(words):
        if w in ("relax.entrypoints.train", "train.py", "train_async.py"):
            return words[i + 1 :]
    raise AssertionError(f"no training target in {words}")


@pytest.fixture(scope="module")
def resolved() -> dict[int, ResolvedScript]:
    return {
        i: resolve_launch_script(TRAINING / script, env=env, script_args=args)
        for i, (script, env, args) in enumerate(CORPUS)
    }


@pytest.mark.parametrize("case", range(len(CORPUS)), ids=CORPUS_IDS)
def test_corpus_matches_what_bash_passes(
    case: int, resolved: dict[int, ResolvedScript], oracle_bin: Path, tmp_path: Path
) -> None:
    script, env, args = CORPUS[case]
    res = resolved[case]
    oracle = run_oracle(oracle_bin, TRAINING / script, env, args, tmp_path)
    # every python / torchrun / ray command, in order, with the same words
    assert [c.argv for c in res.calls] == oracle
    training = [w for w in oracle if w == res.command]
    assert len(training) == 1
    assert res.argv == flags_after_target(training[0])
    assert res.argv[len(res.argv) - len(args) :] == args  # "$@" ends the command
    # the flags parse: every value follows its flag (the spec's flag surface is checked below)
    structural = [
        i for i in decode_argv(res.argv).issues if i.code.startswith("argv.") and i.severity == "error"
    ]
    assert structural == []
    assert res.seconds < 3.0, res.seconds  # typically 0.05–0.08 s


def test_grpo_script_in_detail(resolved: dict[int, ResolvedScript]) -> None:
    res, other = resolved[0], resolved[1]
    text = (TRAINING / "run-qwen3-4B-grpo.sh").read_text().splitlines()
    assert res.launcher == "ray job submit" and res.entrypoint == "python3 -m relax.entrypoints.train"
    assert text[res.line - 1].startswith("ray job submit") and res.file == str(
        TRAINING / "run-qwen3-4B-grpo.sh"
    )
    # the runtime env built in the sourced local.sh, parsed; no NVLink without nvidia-smi
    env_vars = res.runtime_env["env_vars"]
    assert env_vars["NCCL_NVLS_ENABLE"] == "0" and env_vars["PYTHONPATH"] == f"/root/Megatron-LM/:{TREE}"
    # sourced model file, arrays, the branch on ADVANTAGE_ESTIMATOR, the case on LOGGER
    argv = res.argv
    assert argv[:3] == ["--resource", '{"actor": [1, 4], "rollout": [1, 4]}', "--colocate"]
    assert (
        argv[argv.index("--num-layers") + 1] == "36" and argv[argv.index("--normalization") + 1] == "RMSNorm"
    )
    assert argv[argv.index("--rotary-base") + 1] == "1000000"
    assert argv[argv.index("--advantage-estimator") + 1] == "grpo" and "--eps-clip" in argv
    assert "--use-wandb" not in argv
    assert argv[argv.index("--prompt-data") + 1] == "/root/data/dapo-math-17k.clean.jsonl"
    o = other.argv
    assert o[o.index("--advantage-estimator") + 1] == "reinforce_plus_plus" and "--eps-clip" not in o
    assert o[o.index("--wandb-group") + 1] == "qwen3-4B-reinforce_plus_plus"
    # what was not run, with where it was
    skipped = {(Path(c.file).name, c.what) for c in res.skipped}
    assert skipped == {
        ("local.sh", "ray stop --force"),
        ("local.sh", "ray start --head"),
        ("run-qwen3-4B-grpo.sh", "python3 - (a script on standard input)"),
    }
    neutralised = [c.argv[0] for c in res.neutralised]
    assert neutralised.count("pkill") == 3 and {"sleep", "nvidia-smi", "mkdir", "tee"} <= set(neutralised)
    assert (
        res.exit_status == 0
        and res.sha256 == hashlib.sha256((TRAINING / "run-qwen3-4B-grpo.sh").read_bytes()).hexdigest()
    )


def test_slime_style_async_script(resolved: dict[int, ResolvedScript]) -> None:
    res, other = resolved[2], resolved[3]
    assert res.entrypoint == "python3 train_async.py" and res.submission_id == "qwen3-30B-A3B-async-1n"
    assert res.runtime_env == {
        "env_vars": {
            "PYTHONPATH": "/root/Megatron-LM/",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "NCCL_ALGO": "Ring",
            "ACTOR_GPUS": "4",
        }
    }
    a = res.argv
    assert a[a.index("--moe-layer-freq") + 1] == "[1]*48"  # quoted: never a glob
    assert a[a.index("--update-weight-buffer-size") + 1] == str(512 * 1024 * 1024)
    assert a[a.index("--load") + 1] == "/root/models/qwen3-30B-A3B-async"  # ${HF_CKPT%/*}
    assert "--sglang-quantization" not in a
    # the conversion tool gets the same model flags but is not the training command
    (convert,) = [c for c in res.skipped if "convert_hf_to_torch_dist" in c.what]
    assert (
        convert.argv[:2] == ["python", "tools/convert_hf_to_torch_dist.py"]
        and "--num-experts" in convert.argv
    )
    o = other.argv
    assert o[o.index("--actor-num-gpus-per-node") + 1] == "8" and o[o.index("--rollout-num-gpus") + 1] == "8"
    assert (
        o[o.index("--sglang-quantization") + 1] == "fp8"
        and o[o.index("--hf-checkpoint") + 1] == "/mnt/m/Qwen3-30B-A3B"
    )
    assert other.submission_id == "qwen3-30B-A3B-async-2n"


def test_torchrun_command_built_by_a_function(resolved: dict[int, ResolvedScript]) -> None:
    res, other = resolved[4], resolved[5]
    text = (TRAINING / "run-deepseek-v3-sft-torchrun.sh").read_text().splitlines()
    assert res.launcher == "torchrun" and res.entrypoint.startswith("torchrun --nnodes 8 --nproc-per-node 8")
    assert res.entrypoint.endswith(" train.py") and text[res.line - 1].strip() == '"${CMD[@]}" "$@"'
    a = res.argv
    assert a[a.index("--moe-layer-freq") + 1] == "([0]*3+[1]*58)"  # $((…)) in the model file
    assert a[a.index("--resource") + 1] == '{"actor": [1, 64]}'
    assert a[a.index("--expert-model-parallel-size") + 1] == "16" and "--calculate-per-token-loss" in a
    assert a[a.index("--decoder-first-pipeline-num-layers") + 1] == "13"
    o = other.argv
    assert "--decoder-first-pipeline-num-layers" not in o and "--calculate-per-token-loss" not in o
    assert o[o.index("--expert-model-parallel-size") + 1] == "32"  # $((STAGE_GPUS >= 64 ? 64 : STAGE_GPUS))


def test_exec_replaces_the_shell(resolved: dict[int, ResolvedScript]) -> None:
    res, other = resolved[6], resolved[7]
    assert res.entrypoint == "python3 train.py" and res.calls[-1].via == "PATH"  # exec skips functions
    text = (TRAINING / "run-qwen3-4B-sft-exec.sh").read_text().splitlines()
    assert text[res.line - 1].startswith("exec python3 train.py")
    assert res.argv[res.argv.index("--save") + 1] == "/root/ckpt/qwen3-4B-sft"
    assert [c.what for c in res.skipped] == ["python3 -c …", "ray start --head", "ray status"]
    o = other.argv
    assert o[o.index("--prompt-data") + 1] == "/d/x.parquet" and o[-2:] == ["--lr", "2e-5"]


def test_corpus_flags_exist_in_megatron_or_relax() -> None:
    """The corpus uses only flags that Megatron-LM's or Relax's parser defines (SGLang's go through
    as --sglang-*); the launcher flags of ray/torchrun are not in the training argv."""
    refs = [
        p
        for d in (
            os.environ.get("RELAX_REFERENCE_DIR", ""),
            ROOT / "shared" / "reference",
            "/work/shared/reference",
        )
        if d and Path(d).is_dir()
        for p in Path(d).glob("*arguments.py")
    ]
    if not refs:
        pytest.skip("reference argument parsers not found (shared/reference)")
    import re

    known = {m for p in refs for m in re.findall(r"""["'](--[A-Za-z0-9_-]+)["']""", p.read_text())}
    for script, env, args in CORPUS:
        res = resolve_launch_script(TRAINING / script, env=env, script_args=args)
        flags = {w.split("=", 1)[0] for w in res.argv if w.startswith("--")}
        unknown = {f for f in flags if f not in known and not f.startswith("--sglang-")}
        assert not unknown, (script, sorted(unknown))


def test_corpus_specs_validate(resolved: dict[int, ResolvedScript]) -> None:
    """Every corpus command is a valid spec. Needs the spec to know Megatron's and Relax's whole
    flag surface (the field registry being rewritten); until then this fails on unknown flags."""
    problems = {}
    for i, res in resolved.items():
        try:
            jobspec.normalize(argv=res.argv)
        except jobspec.SpecError as err:
            problems[CORPUS_IDS[i]] = [f"{e.code} {e.field}: {e.message}" for e in err.errors][:10]
    assert problems == {}


# Shell behaviour the corpus does not show --------------------------------------------------
def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def test_commands_reached_through_path_and_child_shells(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "stubs.sh",
        "timeout 5 ray status\n"
        'env A=1 python3 -u train.py --x "two words"\n'
        "nohup python3 other.py >/dev/null 2>&1 &\n"
        'sh -c "python3 third.py"\n'
        "bash -c 'python3.11 fourth.py'\n"
        "cat > helper.sh <<'EOF'\nrun() { torchrun --standalone fifth.py; }\nrun\nEOF\n"
        "bash helper.sh\n"
        "wait\n"
        f"export PATH={tmp_path}/bin:$PATH\n"  # a directory with a real python3 first: still captured
        "exec python3 sixth.py\n",
    )
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    res = resolve_launch_script(script)
    assert res.argv == ["--x", "two words"] and res.entrypoint == "python3 -u train.py" and res.line == 2
    seen = {(c.what, c.line, c.via) for c in res.skipped}
    assert ("ray status", 1, "PATH") in seen  # timeout execs through PATH
    assert ("python3 other.py", 3, "PATH") in seen
    assert ("python3 third.py", 4, "PATH") in seen  # sh is not bash: the PATH stub
    assert ("python3.11 fourth.py", 5, "function") in seen  # bash -c: exported functions
    (fifth,) = [c for c in res.skipped if c.kind == "torchrun"]
    assert Path(fifth.file).name == "helper.sh" and fifth.line == 1
    assert res.skipped[-1].what == "python3 sixth.py" and res.skipped[-1].via == "PATH"


def test_records_of_processes_writing_at_once_stay_whole(tmp_path: Path) -> None:
    # bash's printf writes a record in several write(2) calls (a flush at each newline, and at its buffer's
    # size): the fresh-clone CI of 2026-12-07 saw `ray job submit … | tee log`'s two records interleaved,
    # and the training command read as "ray job submit -- function <file> 125". Thirty-two processes at once,
    # each with arguments of several lines and more than a buffer's worth of bytes.
    script = write(
        tmp_path,
        "concurrent.sh",
        'BIG=$(printf "line %d of a long argument\\n" $(seq 1 300))\n'
        "for i in $(seq 1 32); do\n"
        '  ray job submit --runtime-env-json="{\n  \\"n\\": $i\n}" -- python3 -m relax.entrypoints.eval "$BIG" $i'
        " | tee /tmp/never-$i.log &\n"
        "done\n"
        "wait\n"
        'python3 train.py --last "$BIG"\n',
    )
    res = resolve_launch_script(script)
    assert res.argv[0] == "--last" and res.argv[1].count("\n") == 299 and len(res.argv[1]) > 8000
    submits = [c for c in res.skipped if c.kind == "ray"]
    assert sorted(int(c.argv[-1]) for c in submits) == list(range(1, 33)), [c.what for c in submits]
    for c in submits:
        assert c.argv[:3] == ["ray", "job", "submit"] and c.argv[4:8] == [
            "--", "python3", "-m", "relax.entrypoints.eval"
        ], c.argv[:8]  # fmt: skip
        assert c.argv[3] == f'--runtime-env-json={{\n  "n": {c.argv[-1]}\n}}' and c.argv[8] == res.argv[1]
    tees = [c for c in res.neutralised if c.argv[0] == "tee"]
    assert sorted(c.argv[1] for c in tees) == sorted(f"/tmp/never-{i}.log" for i in range(1, 33))


def test_neutralised_commands_leave_the_machine_alone(tmp_path: Path) -> None:
    victim = write(tmp_path, "victim.txt", "keep me\n")
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "relax-sentinel-7f3a"])
    try:
        script = write(
            tmp_path,
            "side-effects.sh",
            "set -e\n"
            f"rm -f {victim}\n"
            f"env rm -f {victim}\n"
            f"mkdir {tmp_path}/made && touch {tmp_path}/touched && cp {victim} {tmp_path}/copy\n"
            f"kill -9 {sentinel.pid}\n"
            "pkill -9 -f relax-sentinel-7f3a\n"
            f"echo data | tee {tmp_path}/teed | grep -q data\n"
            "git clone https://example.com/x.git && pip install nothing && curl -sf https://example.com\n"
            "nvidia-smi || NO_GPU=1\n"
            'python3 train.py --no-gpu "${NO_GPU:-0}"\n',
        )
        t0 = time.monotonic()
        res = resolve_launch_script(script)
        assert time.monotonic() - t0 < 3.0
        assert res.argv == ["--no-gpu", "1"]
        assert victim.read_text() == "keep me\n" and sentinel.poll() is None
        assert not any((tmp_path / n).exists() for n in ("made", "touched", "copy", "teed"))
        assert [c.argv[0] for c in res.neutralised] == [
            "rm", "rm", "mkdir", "touch", "cp", "kill", "pkill", "tee", "git", "pip", "curl", "nvidia-smi",
        ]  # fmt: skip
        assert [c.via for c in res.neutralised[:2]] == ["function", "PATH"]
    finally:
        sentinel.kill()
        sentinel.wait()


def test_resource_limits_are_not_raised(tmp_path: Path) -> None:
    """Relax's NPU scripts start with `ulimit -n 65535` under `set -e`: beyond the hard limit that fails
    without privileges and stopped the script; neutralised, it is recorded and the script goes on."""
    script = write(
        tmp_path, "limits.sh", "set -e\nulimit -n 1048576\nulimit -u unlimited\npython3 train.py --seed 3\n"
    )
    res = resolve_launch_script(script)
    assert res.argv == ["--seed", "3"]
    assert [c.argv for c in res.neutralised] == [["ulimit", "-n", "1048576"], ["ulimit", "-u", "unlimited"]]


def test_no_network(tmp_path: Path) -> None:
    res = resolve_launch_script(write(tmp_path, "probe.sh", "python3 train.py\n"))
    if not res.isolated:
        assert any("no network isolation" in n for n in res.notes)
        pytest.skip("unshare --user --net is not available on this machine")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        script = write(
            tmp_path,
            "net.sh",
            f"if (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; then NET=open; else NET=closed; fi\n"
            'python3 train.py --net "$NET"\n',
        )
        assert resolve_launch_script(script).argv == ["--net", "closed"]
        # the same probe under plain bash does connect: the probe itself works
        plain = subprocess.run(
            ["bash", "-c", f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo open"],
            capture_output=True,
            text=True,
        )
        assert plain.stdout.strip() == "open"


def test_clean_environment_unless_inherited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAX_TEST_CALLER_VAR", "from-caller")
    script = write(
        tmp_path,
        "env.sh",
        'python3 train.py --caller "${RELAX_TEST_CALLER_VAR:-unset}" --given "${GIVEN:-unset}" '
        '--home-is-scratch "$([[ $HOME == */home && $TMPDIR == */tmp && -d $HOME ]] && echo yes)" '
        '--cwd "$PWD" --zero "$0" --source "${BASH_SOURCE[0]}"\n',
    )
    res = resolve_launch_script(script, env={"GIVEN": "x y"})
    a = dict(zip(res.argv[::2], res.argv[1::2], strict=True))
    assert a["--caller"] == "unset" and a["--given"] == "x y" and a["--home-is-scratch"] == "yes"
    real = str(script.resolve())
    assert a["--cwd"] == str(tmp_path.resolve()) and a["--zero"] == real and a["--source"] == real
    inherited = resolve_launch_script(script, env={"GIVEN": "g"}, inherit_env=True)
    assert inherited.argv[1] == "from-caller" and inherited.inherit_env
    assert "RELAX_TEST_CALLER_VAR" not in inherited.env  # only the given pairs are recorded


def test_secrets_are_redacted_from_provenance_not_from_argv(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "secret.sh",
        "export WANDB_API_KEY=abc123\n"
        'HF_TOKEN="${HF_TOKEN}"\n'
        "TOKENIZER=/models/tok\n"
        'ray job submit --runtime-env-json=\'{"env_vars": {"WANDB_API_KEY": "abc123", "A": "1"}}\' '
        '-- python3 -m relax.entrypoints.train --wandb-key "$WANDB_API_KEY" --t "$TOKENIZER" --p "$DB_PASSWORD"\n',
    )
    res = resolve_launch_script(script, env={"DB_PASSWORD": "pw", "MODEL_DIR": "/m"})
    assert res.argv == ["--wandb-key", "abc123", "--t", "/models/tok", "--p", "pw"]
    assert res.env == {"DB_PASSWORD": "***", "MODEL_DIR": "/m"}
    assert res.runtime_env == {"env_vars": {"WANDB_API_KEY": "***", "A": "1"}}
    assert "export WANDB_API_KEY=***\n" in res.text and "abc123" not in res.text.split("\n")[0]
    assert 'HF_TOKEN="${HF_TOKEN}"' in res.text and "TOKENIZER=/models/tok" in res.text
    assert [
        is_secret_name(n) for n in ("hf_token", "AWS_SECRET_ACCESS_KEY", "TOKENIZER_PATH", "MAX_TOKENS")
    ] == [
        True,
        True,
        False,
        False,
    ]
    assert res.sha256 == hashlib.sha256(script.read_bytes()).hexdigest()


def test_long_script_text_is_capped(tmp_path: Path) -> None:
    script = write(tmp_path, "long.sh", "# " + "x" * (300 * 1024) + "\npython3 train.py --a 1\n")
    res = resolve_launch_script(script)
    assert res.text_truncated and len(res.text.encode()) <= TEXT_CAP and res.argv == ["--a", "1"]
    assert res.provenance()["text"] == res.text


def test_ray_job_submit_options(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "ray.sh",
        "ray job submit --no-wait --working-dir . --submission-id=exp-1 --runtime-env env.yaml "
        "-- \"python3 relax/entrypoints/train.py --a 1 --b 'x y'\"\n",
    )
    res = resolve_launch_script(script)
    assert res.argv == ["--a", "1", "--b", "x y"]  # one-word entrypoint: split as Ray's shell would
    assert (res.working_dir, res.submission_id, res.runtime_env_path) == (".", "exp-1", "env.yaml")
    assert any("env.yaml" in n for n in res.notes)


@pytest.mark.parametrize(
    "words,training,rest",
    [
        (["python3", "-m", "relax.entrypoints.train", "--a"], True, ["--a"]),
        (["python", "-um", "relax.entrypoints.train_async", "--a"], True, ["--a"]),
        (["python3.12", "-W", "ignore", "-X", "dev", "train.py", "--a"], True, ["--a"]),
        (["python3", "/opt/relax/relax/entrypoints/train.py", "--a"], True, ["--a"]),
        (
            ["python3", "-m", "torch.distributed.run", "--nproc_per_node", "8", "train.py", "--a"],
            True,
            ["--a"],
        ),
        (["torchrun", "--standalone", "--nproc-per-node=8", "train_async.py", "--a"], True, ["--a"]),
        (["torchrun", "--nnodes", "2", "-m", "relax.entrypoints.train", "--a"], True, ["--a"]),
        (["env", "A=1", "python3", "train.py", "--a"], True, ["--a"]),
        (["python3", "-m", "relax.entrypoints.serve", "--a"], False, None),
        (["python3", "tools/convert_hf_to_torch_dist.py", "--a"], False, None),
        (["python3", "-c", "import train"], False, None),
        (["python3", "-"], False, None),
        (["python3", "--version"], False, None),
    ],
)
def test_training_command_recognition(words: list[str], training: bool, rest: list[str] | None) -> None:
    cmd = _classify(words)
    assert cmd is not None and cmd.training is training
    if rest is not None:
        assert cmd.words[cmd.target.rest :] == rest


# Scripts that cannot be submitted ----------------------------------------------------------
def expect_error(script: Path, code: str, **kw: object) -> LaunchScriptError:
    with pytest.raises(LaunchScriptError) as info:
        resolve_launch_script(script, **kw)  # type: ignore[arg-type]
    assert info.value.code == code, str(info.value)
    return info.value


def test_no_training_command(tmp_path: Path) -> None:
    script = write(
        tmp_path, "convert.sh", "echo converting >&2\npython tools/convert_hf_to_torch_dist.py --x 1\n"
    )
    err = expect_error(script, "no_training_command")
    text = str(err)
    assert "exit status 0" in text and "convert_hf_to_torch_dist.py" in text and "stderr: converting" in text


def test_endless_loop_hits_the_time_limit_with_its_line(tmp_path: Path) -> None:
    script = write(tmp_path, "loop.sh", "n=0\nwhile true; do\n  n=$((n + 1))\ndone\npython3 train.py\n")
    t0 = time.monotonic()
    err = expect_error(script, "timeout", timeout_s=1.0)
    assert time.monotonic() - t0 < 5
    assert err.line in (2, 3) and "loop.sh" in str(err) and "--script-timeout" in str(err)


def test_a_hanging_child_is_killed_with_its_group(tmp_path: Path) -> None:
    marker = f"relax-hang-{os.getpid()}"
    script = write(
        tmp_path, "hang.sh", f"echo start\ntail -f /dev/null {marker} 2>/dev/null\npython3 train.py\n"
    )
    err = expect_error(script, "timeout", timeout_s=1.0)
    assert err.line == 2
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_reading_stdin_is_an_error_naming_the_line(tmp_path: Path) -> None:
    script = write(
        tmp_path, "ask.sh", 'echo "model?"\nread -r MODEL\npython3 train.py --hf-checkpoint "$MODEL"\n'
    )
    err = expect_error(script, "reads_stdin")
    assert err.line == 2 and "--env" in str(err)
    # reading a file, or a here-string, is fine
    (tmp_path / "in.txt").write_text("/m\n")
    ok = write(
        tmp_path, "file.sh", 'read -r M < in.txt\nread -r N <<< "/n"\npython3 train.py --m "$M" --n "$N"\n'
    )
    assert resolve_launch_script(ok).argv == ["--m", "/m", "--n", "/n"]


def test_several_training_commands_are_listed(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "two-stages.sh",
        "python3 train.py --sft\n# then RL\nray job submit -- python3 -m relax.entrypoints.train --rl\n",
    )
    err = expect_error(script, "several_training_commands")
    assert [d.split(": ", 1)[0].rsplit(":", 1)[1] for d in err.details] == ["1", "3"]
    assert "ray job submit -- python3 -m relax.entrypoints.train" in err.details[1]


def test_set_e_failure_before_training(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "fails.sh",
        'set -euo pipefail\nMODEL_DIR="${MODEL_DIR:?set MODEL_DIR first}"\npython3 train.py --m "$MODEL_DIR"\n',
    )
    err = expect_error(script, "exited")
    assert err.line == 2 and "set MODEL_DIR first" in str(err) and "exit status 1" in str(err)
    assert resolve_launch_script(script, env={"MODEL_DIR": "/m"}).argv == ["--m", "/m"]


def test_a_failure_after_the_training_command_is_a_note(tmp_path: Path) -> None:
    script = write(tmp_path, "after.sh", "set -e\npython3 train.py --a 1\nfalse\n")
    res = resolve_launch_script(script)
    assert res.argv == ["--a", "1"] and res.exit_status == 1 and "after its training command" in res.notes[-1]


def test_syntax_errors_name_the_file_and_line(tmp_path: Path) -> None:
    err = expect_error(
        write(tmp_path, "bad.sh", "ARGS=(--a 1)\nif [ -n x ]; then\n  python3 train.py\n"), "syntax"
    )
    assert err.line == 4 and "syntax error" in str(err)
    write(tmp_path, "model.sh", "MODEL_ARGS=(\n  --num-layers 2\n")
    err = expect_error(write(tmp_path, "main.sh", "source ./model.sh\npython3 train.py\n"), "syntax")
    assert err.file and err.file.endswith("model.sh") and err.line == 1 and "unexpected EOF" in str(err)


def test_missing_and_unreadable_scripts(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.sh", "not_found")
    expect_error(tmp_path, "not_found")
    if os.geteuid() != 0:
        locked = write(tmp_path, "locked.sh", "python3 train.py\n")
        locked.chmod(0)
        expect_error(locked, "unreadable")


def test_paths_into_the_scratch_home_are_refused(tmp_path: Path) -> None:
    script = write(tmp_path, "home.sh", 'python3 train.py --save "$HOME/ckpt"\n')
    err = expect_error(script, "scratch_path")
    assert "--env HOME=" in str(err)
    assert resolve_launch_script(script, env={"HOME": "/home/me"}).argv == ["--save", "/home/me/ckpt"]


def test_a_runtime_env_ray_would_refuse_is_noted_not_fatal(tmp_path: Path) -> None:
    """Provenance only: an empty or broken $RUNTIME_ENV_JSON (filled in by an entrypoint script the user
    did not source) does not stop the training command from being read."""
    script = write(
        tmp_path,
        "rt.sh",
        "ray job submit --runtime-env-json='{bad' -- python3 train.py --lr 1\n"
        'ray job submit --runtime-env-json="${RUNTIME_ENV_JSON}" -- python3 train.py --lr 2\n',
    )
    with pytest.raises(LaunchScriptError) as info:  # two training commands: both are listed
        resolve_launch_script(script)
    assert info.value.code == "several_training_commands"
    script.write_text("ray job submit --runtime-env-json='[1]' -- python3 train.py --lr 1\n")
    res = resolve_launch_script(script)
    assert res.argv == ["--lr", "1"] and res.runtime_env is None
    assert any("not a JSON object" in n for n in res.notes)
    script.write_text("ray job submit --runtime-env-json='{bad' -- python3 train.py --lr 1\n")
    res = resolve_launch_script(script)
    assert res.runtime_env is None and any("not valid JSON" in n for n in res.notes)


def test_a_redirection_into_a_directory_mkdir_did_not_make_gets_a_hint(tmp_path: Path) -> None:
    script = write(
        tmp_path,
        "redirect.sh",
        'LOG_DIR=${LOG_DIR:-/nonexistent/relax-logs}\nmkdir -p "$LOG_DIR"\n'
        'python3 train.py --a 1 > "$LOG_DIR/train.log" 2>&1\n',
    )
    err = expect_error(script, "exited")
    assert err.line == 3 and any(d.startswith("hint: bash could not open a redirection") for d in err.details)
    (tmp_path / "logs").mkdir()
    assert resolve_launch_script(script, env={"LOG_DIR": str(tmp_path / "logs")}).argv == ["--a", "1"]
