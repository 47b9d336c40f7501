"""Checks a running `compose.yaml` deployment end to end through its published port (tools/compose_smoke.sh runs
it; docs/deploy.md, "What was run"): readiness, the dashboard, the pool Ray's node list made, one SFT job that
trains and exports, then `--jobs` SFT jobs submitted at once (each a slot; the two API replicas behind the proxy
take them, the two schedulers' passes admit them) while the pool is sampled: no node and no pool is ever given
more slots than it has, and every job succeeds. Prints a table; exits 1 on the first broken check.

    python -m tools.compose_check --url http://localhost:8400 --api-key KEY [--jobs 8] [--timeout 600]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from client.sdk import RelaxClient
from wire.jobs import JobStatus

ROOT = Path(__file__).resolve().parents[1]


class Check:
    def __init__(self, url: str, key: str) -> None:
        self.api = RelaxClient(url, key, timeout=60)
        self.http = httpx.Client(base_url=url, timeout=60)  # what is not the API's: /readyz, the dashboard
        self.rows: list[tuple[str, str]] = []

    def row(self, what: str, result: str) -> None:
        self.rows.append((what, result))
        print(f"  {what}: {result}", flush=True)

    def submit(self, name: str, spec: dict[str, Any]) -> str:
        return str(self.api.submit_job(spec=spec, name=name)["id"])

    def pool(self) -> dict[str, Any]:
        (pool,) = self.api.pools()
        for node in pool["nodes"]:
            if node["allocated_gpus"] > node["gpus"]:
                raise SystemExit(
                    f"node {node['name']} given {node['allocated_gpus']} of {node['gpus']} slots"
                )
        if pool["allocated_gpus"] > pool["total_gpus"]:
            raise SystemExit(
                f"pool {pool['name']} given {pool['allocated_gpus']} of {pool['total_gpus']} slots"
            )
        return pool

    def wait(self, ids: set[str], timeout: float) -> tuple[dict[str, dict[str, Any]], int, int]:
        """Until every job of `ids` has ended, sampling the pool (its bounds checked) every 0.5 s."""
        began, samples, most = time.monotonic(), 0, 0
        while True:
            most = max(most, self.pool()["allocated_gpus"])
            samples += 1
            jobs = {j: self.api.get_job(j) for j in ids}
            if all(JobStatus(job["status"]).is_terminal() for job in jobs.values()):
                return jobs, samples, most
            if time.monotonic() - began > timeout:
                raise SystemExit(
                    f"jobs not ended after {timeout:.0f} s: { {j: v['status'] for j, v in jobs.items()} }"
                )
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.compose_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://localhost:8400")
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--jobs", type=int, default=8, help="SFT jobs submitted at once (default 8)")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    c = Check(args.url, args.api_key)

    ready = c.http.get("/readyz").json()
    if ready.get("status") != "ready":
        raise SystemExit(f"/readyz: {ready}")
    c.row("/readyz", ", ".join(f"{k} {v}" for k, v in ready.items()))
    page = c.http.get("/")
    assets = re.findall(r'src="(?:\./|/)?(assets/[^"]+\.js)"', page.text)
    if page.status_code != 200 or not assets or c.http.get("/" + assets[0]).status_code != 200:
        raise SystemExit(f"the dashboard is not served: GET / {page.status_code}, assets {assets}")
    c.row("dashboard", f"GET / 200 ({len(page.text)} B), {assets[0]} 200")
    pool = c.pool()
    nodes = ", ".join(
        f"{n['name']} {n['gpus']} slots {'alive' if n['alive'] else 'down'}" for n in pool["nodes"]
    )
    c.row("pool", f"{pool['name']} ({pool['accelerator']}, Ray {pool['ray_address']}): {nodes}")

    spec = yaml.safe_load((ROOT / "examples" / "sft-arith.yaml").read_text())["spec"]
    began = time.monotonic()
    first = c.submit("sft-arith", spec)
    jobs, _, _ = c.wait({first}, args.timeout)
    job = jobs[first]
    loss = c.api.metrics(first, names=["train/loss"]).get("train/loss", [])
    if job["status"] != "SUCCEEDED":
        raise SystemExit(f"sft-arith {first}: {job['status']} {job.get('status_reason')}")
    curve = f", train/loss {loss[0]['value']:.3f} -> {loss[-1]['value']:.3f}" if loss else ""
    c.row("one SFT job", f"SUCCEEDED in {time.monotonic() - began:.1f} s{curve}")

    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
        ids = set(ex.map(lambda i: c.submit(f"sft-arith-{i}", spec), range(args.jobs)))
    jobs, samples, most = c.wait(ids, args.timeout)
    bad = {j: v["status"] for j, v in jobs.items() if v["status"] != "SUCCEEDED"}
    if bad:
        raise SystemExit(f"jobs not SUCCEEDED: {bad}")
    c.row(
        f"{args.jobs} SFT jobs at once",
        f"all SUCCEEDED in {time.monotonic() - began:.1f} s; pool sampled {samples} times, "
        f"at most {most} of {pool['total_gpus']} slots given, never more on a node or the pool",
    )
    print("\n| check | result |\n|---|---|")
    for what, result in c.rows:
        print(f"| {what} | {result} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
