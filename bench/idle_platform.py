"""What an idle embedded platform costs: CPU seconds a minute, by process, with nothing submitted.

    python -m bench.idle_platform [--settle 20] [--seconds 60] [--top 12] [--env NAME=VALUE ...]

Starts the embedded platform (`python -m api.embedded`, as `make run` does, in a temporary RELAX_HOME) with
`--env` settings added to its environment, waits `--settle` seconds for start-up to finish, then reads the
user + system CPU time of every process of its tree (the API, the Celery worker and beat, Ray's GCS,
raylet, dashboard and agents) at the start and the end of `--seconds`, and prints a table: CPU seconds a
minute for each process and in all, and the share of one core. Compare settings with `--env`, e.g.
`--env RELAX_BROKER_IDLE_POLL_SECONDS=0.05` (the broker's fixed fast polling of before) against the default.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import psutil

from bench.harness import environ, start_platform, stop_platform


def _cpu(root: psutil.Process) -> dict[tuple[int, str], float]:
    seen: dict[tuple[int, str], float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            name = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        seen[(proc.pid, _short(name))] = times.user + times.system
    return seen


def _short(cmdline: str) -> str:
    for marker in (
        "-m celery -A scheduler.worker --quiet worker",
        "-m celery -A scheduler.worker --quiet beat",
    ):
        if marker in cmdline:
            return "celery " + marker.rsplit(" ", 1)[1]
    if "-m api.embedded" in cmdline:
        return "api.embedded (supervisor)"
    if "uvicorn" in cmdline:
        return "uvicorn (API)"
    for part in (
        "gcs_server",
        "raylet",
        "dashboard.py",
        "log_monitor",
        "monitor.py",
        "ray.util.client.server",
    ):
        if part in cmdline:
            return "ray " + part
    return cmdline[:48]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settle", type=float, default=20.0, help="seconds after start-up before measuring")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to measure")
    ap.add_argument("--top", type=int, default=12, help="processes listed")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.env)
    with environ(extra):
        platform = start_platform(Path(tempfile.mkdtemp(prefix="relax-idle-")) / "home")
    try:
        time.sleep(args.settle)
        root = psutil.Process(platform.proc.pid)
        before = _cpu(root)
        began = time.monotonic()
        time.sleep(args.seconds)
        after = _cpu(root)
        took = time.monotonic() - began
    finally:
        stop_platform(platform)
    per_min = {key: (after[key] - before.get(key, 0.0)) * 60.0 / took for key in after}
    total = sum(per_min.values())
    settings = " ".join(args.env) or "defaults"
    print(f"idle embedded platform ({settings}), {took:.0f} s measured after {args.settle:.0f} s\n")
    print("| process | pid | CPU s/min | share of a core |\n|---|---|---|---|")
    for (pid, name), value in sorted(per_min.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {name} | {pid} | {value:.2f} | {value / 60:.1%} |")
    print(f"| **all {len(per_min)} processes** | | **{total:.2f}** | **{total / 60:.1%}** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
