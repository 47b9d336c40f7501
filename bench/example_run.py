"""The README's example, measured: SFT warm-up then GRPO on the embedded platform.

`python -m bench.example_run` starts the platform in a temp home (as `make run` does), builds the tiny
model, submits examples/sft-arith.yaml and examples/grpo-arith.yaml with --wait, and prints one table:
wall time of each job and of the whole run, the GRPO reward curve (first, middle, last steps) and the
peak memory of the whole platform (API, worker, Ray and every job process), sampled twice a second.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench.harness import start_platform, stop_platform
from client.sdk import RelaxClient


class TreeMemory:
    """Peak of the summed RSS and PSS of a process and all its descendants."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak_rss = self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = pss = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    info = p.memory_full_info()
                    rss += info.rss
                    pss += getattr(info, "pss", info.rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self._stop.wait(0.5)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def overridden(path: Path, settings: list[str], folder: Path) -> Path:
    """A copy of the job file at `path` with `KEY=YAML` entries of its spec replaced, in `folder`."""
    import yaml

    doc = yaml.safe_load(path.read_text())
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or key not in doc["spec"]:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE with KEY one of {path.name}'s spec entries")
        doc["spec"][key] = yaml.safe_load(value)
    out = folder / path.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument(
        "--grpo",
        default="grpo-arith",
        help="the GRPO example to run after the SFT warm-up (grpo-arith-megatron: the megatron backend, TP=2)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=YAML",
        help="override one spec entry of the GRPO example (e.g. resource sizes on a host with fewer devices); "
        'the value is YAML (`--set \'resource={"actor": [1, 1], "rollout": [1, 1]}\'`)',
    )
    args = ap.parse_args()
    rows: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="relax-bench-") as tmp:
        t0 = time.time()
        platform = start_platform(Path(tmp) / "home")
        rows["platform start (s)"] = round(time.time() - t0, 1)
        try:
            with TreeMemory(platform.proc.pid) as mem:
                t1 = time.time()
                r = platform.relaxctl("models", "tiny")
                assert r.returncode == 0, r.stderr
                rows["relaxctl models tiny (s)"] = round(time.time() - t1, 1)
                files = {"sft-arith": "examples/sft-arith.yaml", args.grpo: f"examples/{args.grpo}.yaml"}
                if args.set:
                    files[args.grpo] = str(overridden(Path(files[args.grpo]), args.set, Path(tmp)))
                    rows["GRPO spec overrides"] = args.set
                for name, file in files.items():
                    t = time.time()
                    r = platform.relaxctl("submit", file, "--wait")
                    if r.returncode != 0:
                        raise SystemExit(f"{name} did not succeed:\n{r.stdout}\n{r.stderr}\n{platform.log()}")
                    rows[f"{name} wall (s)"] = round(time.time() - t, 1)
                rows["example total wall (s)"] = round(time.time() - t1, 1)
            c = RelaxClient(platform.url, platform.key)
            grpo = c.list_jobs(name=args.grpo)["data"][0]
            reward = [p["value"] for p in c.metrics(grpo["id"], names=["rollout/reward"])["rollout/reward"]]
            steps = c.metrics(grpo["id"], names=["perf/step_time"]).get("perf/step_time", [])
            n = len(reward)
            rows["GRPO steps"] = n
            rows["rollout/reward first 3"] = [round(v, 3) for v in reward[:3]]
            rows["rollout/reward middle 3"] = [round(v, 3) for v in reward[n // 2 - 1 : n // 2 + 2]]
            rows["rollout/reward last 3"] = [round(v, 3) for v in reward[-3:]]
            if steps:
                rows["GRPO mean step time (s)"] = round(sum(p["value"] for p in steps) / len(steps), 2)
            rows["peak platform RSS (MiB)"] = round(mem.peak_rss / 2**20)
            rows["peak platform PSS (MiB)"] = round(mem.peak_pss / 2**20)
        finally:
            rows["platform stop (s)"] = round(stop_platform(platform), 1)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    width = max(len(k) for k in rows)
    print(f"{'measure':<{width}}  value")
    print(f"{'-' * width}  {'-' * 30}")
    for k, v in rows.items():
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
