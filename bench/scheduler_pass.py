"""Scheduling-pass throughput: one pass of the policy over 10,000 queued jobs on 1,000 nodes.

    python -m bench.scheduler_pass [--jobs 10000] [--nodes 1000] [--repeat 5] [--json]

Times `schedule` (and the baselines) alone, on snapshots built in memory: the policy's share of
a pass, without the database around it. Each mix is timed `--repeat` times; the best is shown.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass

from scheduler.policy import POLICIES, Assignment, Gang, JobView, Node, Placement, Queue, Snapshot
from scheduler.policy.invariants import check
from wire.jobs import JobStatus

GPUS_PER_NODE = 8
# Job sizes in the proportions of the ITP trace (docs/benchmarks.md): mostly 1-GPU jobs.
SIZES = (1, 2, 4, 8, 16, 32, 64)
SIZE_WEIGHTS = (57682, 1483, 2371, 7009, 381, 354, 71)


@dataclass(frozen=True)
class Mix:
    name: str
    # Share of the pool's GPUs already held by running jobs.
    busy: float
    # Queues over nominal quota (their running jobs are borrowed) while the rest have queued work.
    borrowing: bool = False
    description: str = ""


MIXES = (
    Mix("empty pool", 0.0, description="nothing running: the pass admits until the pool is full"),
    Mix("half full", 0.5, description="half the GPUs held: admits about half the pool's worth"),
    Mix("full pool", 0.97, description="almost nothing fits: the pass mostly explains why jobs wait"),
    Mix(
        "reclaim",
        0.97,
        borrowing=True,
        description="a few queues borrow the whole pool; the others reclaim by preemption",
    ),
)


def demand(gpus: int) -> tuple[Gang, ...]:
    if gpus <= GPUS_PER_NODE:
        return (Gang("worker", gpus),)
    return (Gang("worker", GPUS_PER_NODE, gpus // GPUS_PER_NODE),)


def build_snapshot(mix: Mix, jobs: int, nodes: int, queues: int = 20, seed: int = 7) -> Snapshot:
    rng = random.Random(seed)
    node_list = tuple(Node(f"node-{i:04d}", "pool", GPUS_PER_NODE) for i in range(nodes))
    capacity = nodes * GPUS_PER_NODE
    queue_list = tuple(
        Queue(f"queue-{i:02d}", "pool", f"team-{i:02d}", capacity // queues) for i in range(queues)
    )
    running: list[JobView] = []
    target = int(mix.busy * capacity)
    free = {n.name: GPUS_PER_NODE for n in node_list}
    names = list(free)
    held = 0
    k = 0
    # Fill nodes in order with running jobs (whole nodes for 8-GPU jobs, else packed).
    while held < target:
        gpus = rng.choices((1, 2, 4, 8), (8, 1, 1, 3))[0]
        node = next((n for n in names if free[n] >= gpus), None)
        if node is None:
            break
        free[node] -= gpus
        held += gpus
        if free[node] == 0:
            names.remove(node)
        # Borrowing mix: the first quarter of the queues hold everything that runs.
        qi = rng.randrange(queues // 4) if mix.borrowing else rng.randrange(queues)
        started = rng.uniform(0, 36_000)
        checkpoints = int((36_000 - started) // 1800)
        running.append(
            JobView(
                f"job-r{k:05d}",
                queue_list[qi].name,
                started - 60,
                demand(gpus),
                state=JobStatus.RUNNING,
                placement=Placement((Assignment("worker", 0, node, gpus),)),
                started_at=started,
                last_checkpoint_at=started + 1800 * checkpoints if checkpoints else None,
            )
        )
        k += 1
    queued = []
    for i in range(jobs):
        gpus = rng.choices(SIZES, SIZE_WEIGHTS)[0]
        qi = rng.randrange(queues // 4, queues) if mix.borrowing else rng.randrange(queues)
        queued.append(JobView(f"job-q{i:05d}", queue_list[qi].name, rng.uniform(0, 36_000), demand(gpus)))
    return Snapshot(36_000.0, node_list, queue_list, tuple(running + queued))


def time_pass(policy, snap: Snapshot, repeat: int) -> tuple[float, object]:
    best = float("inf")
    decision = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        decision = policy(snap)
        best = min(best, time.perf_counter() - t0)
    return best, decision


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scheduler_pass", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--policies", default="ours,fifo_backfill")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for mix in MIXES:
        snap = build_snapshot(mix, args.jobs, args.nodes)
        running = sum(1 for j in snap.jobs if j.running)
        for name in args.policies.split(","):
            seconds, decision = time_pass(POLICIES[name.strip()], snap, args.repeat)
            violations = check(snap, decision)
            rows.append(
                {
                    "mix": mix.name,
                    "policy": name.strip(),
                    "running": running,
                    "queued": args.jobs,
                    "pass_ms": seconds * 1000,
                    "admitted": len(decision.admit),
                    "admissions_per_s": len(decision.admit) / seconds if seconds else 0.0,
                    "preempted": len(decision.preempt),
                    "explained": len(decision.waiting),
                    "violations": len(violations),
                }
            )
    if args.json:
        json.dump({"nodes": args.nodes, "gpus_per_node": GPUS_PER_NODE, "rows": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"one pass over {args.jobs:,} queued jobs on {args.nodes:,} nodes x {GPUS_PER_NODE} GPUs "
        f"(best of {args.repeat}); every decision checked by scheduler.policy.invariants"
    )
    header = f"{'mix':<11} {'policy':<14} {'running':>7} {'pass ms':>8} {'admitted':>8} {'adm/s':>9} {'preempt':>7} {'waiting':>7} {'viol':>4}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['mix']:<11} {r['policy']:<14} {r['running']:>7} {r['pass_ms']:>8.1f} {r['admitted']:>8} "
            f"{r['admissions_per_s']:>9.0f} {r['preempted']:>7} {r['explained']:>7} {r['violations']:>4}"
        )
    for mix in MIXES:
        print(f"  {mix.name}: {mix.description}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
