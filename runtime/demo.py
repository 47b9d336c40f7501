"""Runs examples/sft-arith then grpo-arith standalone, resolving their paths as the platform would."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runtime.spec import read_spec_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PATH_KEYS = (
    "hf-checkpoint",
    "ref-load",
    "prompt-data",
    "load",
    "save",
    "save-hf",
    "eval-prompt-data",
    "eval-config",
    "save-debug-rollout-data",
    "load-debug-rollout-data",
)


@dataclass
class JobRun:
    name: str
    wall_s: float
    peak_mb: float
    exit_code: int
    job_dir: Path


def resolve(value: Any, *, root: Path, job_dir: Path) -> Any:
    """artifacts://X -> <root>/artifacts/X; job://NAME/REL -> <root>/jobs/NAME/REL; relative -> the job's dir."""
    if isinstance(value, list):
        return [resolve(v, root=root, job_dir=job_dir) for v in value]
    if not isinstance(value, str):
        return value
    if value.startswith("artifacts://"):
        return str(root / "artifacts" / value.removeprefix("artifacts://"))
    if value.startswith("job://"):
        name, _, rel = value.removeprefix("job://").partition("/")
        return str(root / "jobs" / name / rel)
    return value if os.path.isabs(value) else str(job_dir / value)


def prepare(root: Path, example: str, overrides: dict[str, Any]) -> tuple[str, Path]:
    spec, name = read_spec_file(EXAMPLES / example)
    name = name or Path(example).stem
    job_dir = root / "jobs" / name
    job_dir.mkdir(parents=True, exist_ok=True)
    spec.update(overrides)
    for key in PATH_KEYS:
        if key in spec:
            if key == "eval-prompt-data":  # name path name path ...
                spec[key] = [
                    v if i % 2 == 0 else resolve(v, root=root, job_dir=job_dir)
                    for i, v in enumerate(spec[key])
                ]
            else:
                spec[key] = resolve(spec[key], root=root, job_dir=job_dir)
    shutil.rmtree(job_dir / "report", ignore_errors=True)  # LocalReporter appends; start each demo clean
    spec_file = job_dir / "spec.json"
    spec_file.write_text(json.dumps({"name": name, "spec": spec}, indent=2) + "\n")
    return name, spec_file


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def _tree_pss_mb(pid: int) -> float:
    """PSS of a process and all its descendants (Ray's raylet, GCS and actor workers included), from
    /proc/<pid>/smaps_rollup (Linux)."""
    total_kb = 0
    for member in _descendants(pid):
        try:
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
                    break
        except (OSError, ValueError):
            continue
    return total_kb / 1024


def run_job(name: str, spec_file: Path) -> JobRun:
    # The driver's private Ray, on this machine's loopback only (Ray's single-machine mode).
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env["PYTHONUNBUFFERED"] = "1"
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "runtime.driver", "--spec-file", str(spec_file)], env=env)
    peak = [0.0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_pss_mb(proc.pid))
            time.sleep(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    sampler.join(timeout=5)
    return JobRun(name, time.perf_counter() - started, peak[0], code, spec_file.parent)


def reward_curve(job_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (job_dir / "report" / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r["value"] for r in rows if r["name"] == "rollout/reward"}
    return [by_step[s] for s in sorted(by_step)]


def summarize(curve: list[float], window: int = 10) -> str:
    if not curve:
        return "no rollout/reward"
    mid = len(curve) // 2
    first, middle, last = curve[:window], curve[mid - window // 2 : mid + window // 2], curve[-window:]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return (
        f"rollout/reward over {len(curve)} steps: first {window} {mean(first):.3f}, "
        f"middle {mean(middle):.3f}, last {window} {mean(last):.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path, help="work folder (artifacts/ and jobs/ go here)")
    parser.add_argument("--seed", type=int, default=None, help="override both jobs' seed")
    parser.add_argument("--model-seed", type=int, default=0)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument(
        "--examples",
        nargs="+",
        default=["sft-arith.yaml", "grpo-arith.yaml"],
        help="example files to run in order (default: the arithmetic pair; try sft-chat.yaml grpo-chat.yaml)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec entry of the last example (YAML value), e.g. --set num-rollout=100",
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    from runtime.data.arith import write_datasets
    from runtime.models.tiny import build_tiny_model

    build_tiny_model(root / "artifacts" / "models" / "tiny", seed=args.model_seed)
    write_datasets(root / "artifacts" / "datasets" / "arith", seed=args.data_seed)
    overrides = {} if args.seed is None else {"seed": args.seed, "rollout-seed": args.seed}
    last_overrides = dict(overrides)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        last_overrides[key] = yaml.safe_load(value)
    runs = []
    for i, example in enumerate(args.examples):
        last = i == len(args.examples) - 1
        name, spec_file = prepare(root, example, last_overrides if last else overrides)
        run = run_job(name, spec_file)
        runs.append(run)
        print(
            f"[demo] {name}: exit {run.exit_code}, wall {run.wall_s:.1f}s, peak PSS {run.peak_mb:.0f} MiB",
            flush=True,
        )
        if run.exit_code != 0:
            return run.exit_code
    print(f"[demo] {summarize(reward_curve(runs[-1].job_dir))}")
    print(
        f"[demo] total wall {sum(r.wall_s for r in runs):.1f}s, peak PSS {max(r.peak_mb for r in runs):.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
