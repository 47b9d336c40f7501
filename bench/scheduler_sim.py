"""Trace-driven scheduler simulator: replays a GPU job trace through the real policy on a virtual clock.

    python -m bench.scheduler_sim [--trace PATH] [--policies fifo,fifo_backfill,ours] [--limit N] [--json]
    python -m bench.scheduler_sim --elastic [--limit N]   # elastic rollout: preemptions with and without shrink

The policies are the functions in `scheduler.policy` called exactly as the scheduling pass calls
them, on a Snapshot rebuilt at every pass. The simulator alone knows each job's true duration; the
policy sees submit, start and checkpoint times only. A preemption costs what it would for real: the
work since the job's last checkpoint (one every 30 minutes of progress) plus a 5-minute restart.

`--elastic`: the trace's jobs of 4 to 8 GPUs are RL jobs (`elastic_demand`: a trainer of half the GPUs
and 1-GPU rollout engines, down to 1 and up to twice as many); the policy may take engines back instead
of preempting (`PolicyConfig.elastic_shrink`) and grow jobs into idle GPUs (`elastic_grow`). Such a job
progresses in proportion to the GPUs it holds (its trace GPUs: full speed), and a resize is applied at
once (a real scale-in waits for its engines to drain, seconds). The table compares `ours` without
elasticity (the same RL-shaped demands, rigid), with shrink, and with shrink and grow.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import heapq
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.policy import POLICIES, Decision, Gang, JobView, Node, PolicyConfig, Queue, Snapshot
from scheduler.policy.types import demand_gpus
from wire.jobs import JobStatus

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces" / "itp" / "all_clusters.csv"
)
NODES = 160
GPUS_PER_NODE = 8
POOL = "shared"
CHECKPOINT_INTERVAL_S = 1800.0
RESTART_DELAY_S = 300.0
SIZE_CLASSES = (("1", 1, 1), ("2-8", 2, 8), ("16+", 16, 1 << 30))

# Event kinds, in the order they are applied at one instant: GPUs are freed before jobs arrive.
_FINISH, _CHECKPOINT, _SUBMIT, _PASS = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit: float
    gpus: int
    duration: float
    tenant: str


def load_trace(path: Path, limit: int | None = None) -> list[TraceJob]:
    jobs: list[TraceJob] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            jobs.append(
                TraceJob(
                    row["job_id"],
                    float(row["submit_time"]),
                    int(row["num_gpus"]),
                    float(row["duration"]),
                    row["tenant"],
                )
            )
            if limit is not None and len(jobs) >= limit:
                break
    jobs.sort(key=lambda j: (j.submit, j.id))
    return jobs


@functools.cache
def demand_for(gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> tuple[Gang, ...]:
    """Up to one node: one group on one node; bigger: whole nodes. (Shared: identical demands.)"""
    if gpus <= gpus_per_node:
        return (Gang("worker", gpus, 1, True),)
    return (Gang("worker", gpus_per_node, math.ceil(gpus / gpus_per_node), True),)


@functools.cache
def elastic_demand(gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> tuple[Gang, ...]:
    """A job of 4 to a node's GPUs as an RL job: a trainer of half its GPUs on one node and 1-GPU rollout
    engines for the rest (elastic from 1 to twice as many); any other job as `demand_for`. Its progress grows with
    the GPUs it holds, so its driver always asks for all the engines it may have (`Gang.wish`: what the pass
    grows it to)."""
    if not 4 <= gpus <= gpus_per_node:
        return demand_for(gpus, gpus_per_node)
    actor = gpus // 2
    engines = gpus - actor
    return (
        Gang("actor", actor, 1, True),
        Gang(
            "rollout",
            1,
            engines,
            True,
            min_count=1,
            max_count=2 * engines,
            base_count=engines,
            wish=2 * engines,
        ),
    )


def tenant_queues(jobs: list[TraceJob], capacity: int) -> tuple[Queue, ...]:
    """One queue per tenant; nominal quota proportional to the tenant's GPU-hours in the trace.

    An operator sets quotas from teams' past usage; the policy never reads a job's duration.
    Largest-remainder rounding makes the quotas add up to the pool exactly.
    """
    work: dict[str, float] = {}
    for j in jobs:
        work[j.tenant] = work.get(j.tenant, 0.0) + j.gpus * j.duration
    total = sum(work.values()) or 1.0
    exact = {t: capacity * w / total for t, w in work.items()}
    nominal = {t: int(x) for t, x in exact.items()}
    for t in sorted(exact, key=lambda t: exact[t] - nominal[t], reverse=True)[
        : capacity - sum(nominal.values())
    ]:
        nominal[t] += 1
    return tuple(Queue(t, POOL, t, nominal[t]) for t in sorted(nominal))


@dataclass
class _SimJob:
    trace: TraceJob
    view: JobView
    remaining: float
    state: str = "pending"  # pending | queued | running | done
    run_start: float = 0.0
    work_start: float = 0.0  # run_start plus the restart delay on a resumed run
    token: int = 0
    queued_since: float = 0.0
    queued_total: float = 0.0
    longest_wait: float = 0.0  # the longest single stretch queued (first wait or after a preemption)
    last_checkpoint: float | None = None
    preemptions: int = 0
    service_gpu_s: float = 0.0  # GPU-seconds of earlier runs, as the platform would record them
    allocated_gpu_s: float = 0.0
    completion: float = 0.0
    # progress of the current run, in full-speed seconds: a resized job runs at held / trace GPUs
    rate: float = 1.0
    held: int = 0
    segment_start: float = 0.0  # since when `rate` and `held` hold
    run_work: float = 0.0  # work done by `segment_start`
    checkpoint_work: float = 0.0  # work done at the run's latest checkpoint
    end: float = 0.0
    next_checkpoint: float = 0.0

    def work(self, now: float) -> float:
        return self.run_work + max(0.0, now - max(self.segment_start, self.work_start)) * self.rate

    def rebuilt_view(self, **fields: Any) -> JobView:
        """A fresh view of this job (no nomination) with its preemptions and attained service, and `fields`."""
        v = self.view
        return JobView(
            v.id,
            v.queue,
            v.submit_time,
            v.demand,
            preemptions=self.preemptions,
            service_gpu_s=self.service_gpu_s,
            **fields,
        )


@dataclass
class SimResult:
    policy: str
    jobs: int
    metrics: dict[str, float]
    per_tenant_slowdown: dict[str, float]
    wall_s: float
    cpu_s: float
    passes: int
    pass_s: float
    notes: list[str] = field(default_factory=list)


def simulate(
    trace: list[TraceJob],
    policy: Callable[..., Decision],
    *,
    policy_name: str = "",
    nodes: int = NODES,
    gpus_per_node: int = GPUS_PER_NODE,
    queues: tuple[Queue, ...] | None = None,
    window_s: float = 0.0,
    beat_s: float = 300.0,
    check: Callable[[Snapshot, Decision], list[str]] | None = None,
    elastic: bool = False,
) -> SimResult:
    """Replay `trace` and measure it.

    A pass runs after every instant at which a job arrived or ended (or once per `window_s` of
    such instants), and every `beat_s` while jobs wait, as the platform's periodic beat does:
    aging and reclaim grace depend on time alone. No pass runs while nothing is queued (with `elastic`,
    RL-shaped demands, `elastic_demand`, and a pass at every such instant: idle GPUs grow jobs).
    """
    t0 = time.perf_counter()
    c0 = time.process_time()
    node_list = tuple(Node(f"n{i:04d}", POOL, gpus_per_node) for i in range(nodes))
    queues = queues if queues is not None else tenant_queues(trace, nodes * gpus_per_node)
    free = {n.name: n.gpus for n in node_list}
    shape = elastic_demand if elastic else demand_for
    sim = [
        _SimJob(t, JobView(t.id, t.tenant, t.submit, shape(t.gpus, gpus_per_node)), t.duration) for t in trace
    ]
    events: list[tuple[float, int, int, int, int]] = []
    seq = 0
    for i, j in enumerate(sim):
        events.append((j.trace.submit, _SUBMIT, seq, i, 0))
        seq += 1
    heapq.heapify(events)
    active: dict[str, int] = {}  # id -> index, queued or running, in arrival order
    views: dict[str, JobView] = {}  # the same jobs' current views, for building snapshots
    queued = 0
    pass_pending = False
    passes = 0
    pass_time = 0.0
    preemptions = 0
    shrinks = grows = engines_back = 0
    by_kind: dict[str, int] = {}
    violations: list[str] = []

    def push(t: float, kind: int, i: int, token: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, kind, seq, i, token))
        seq += 1

    def start(i: int, placement, now: float) -> None:
        nonlocal queued
        j = sim[i]
        for node, g in placement.node_gpus:
            free[node] -= g
            if free[node] < 0:
                raise AssertionError(f"{node} over-allocated admitting {j.trace.id}")
        j.state = "running"
        j.run_start = now
        j.work_start = now + (RESTART_DELAY_S if j.preemptions else 0.0)
        j.queued_total += now - j.queued_since
        j.longest_wait = max(j.longest_wait, now - j.queued_since)
        queued -= 1
        j.view = views[j.trace.id] = j.rebuilt_view(
            state=JobStatus.RUNNING,
            placement=placement,
            started_at=now,
            last_checkpoint_at=j.last_checkpoint,
            queued_at=j.view.queued_at,
        )
        j.run_work = j.checkpoint_work = 0.0
        j.next_checkpoint = j.work_start + CHECKPOINT_INTERVAL_S
        set_speed(j, now, demand_gpus(j.view.demand))

    def set_speed(j: _SimJob, now: float, held: int) -> None:
        """From `now` the job holds `held` GPUs: its progress rate, finish and next checkpoint follow."""
        if j.held:
            j.allocated_gpu_s += (now - j.segment_start) * j.held
            j.run_work = j.work(now)
        j.segment_start = now
        # full speed on the GPUs its spec asks for (the trace's count, as a rigid job holds it)
        full = demand_gpus(elastic_demand(j.trace.gpus, gpus_per_node)) if elastic else held
        j.held = round(j.trace.gpus * held / full)
        j.rate = held / full
        j.token += 1
        i = active[j.trace.id]
        j.end = max(now, j.work_start) + (j.remaining - j.run_work) / j.rate
        push(j.end, _FINISH, i, j.token)
        if j.next_checkpoint < j.end:
            push(j.next_checkpoint, _CHECKPOINT, i, j.token)

    def resize(r, now: float) -> None:
        nonlocal shrinks, grows, engines_back
        j = sim[active[r.job_id]]
        assert j.view.placement is not None
        for node, g in j.view.placement.node_gpus:
            free[node] += g
        for node, g in r.placement.node_gpus:
            free[node] -= g
            if free[node] < 0:
                raise AssertionError(f"{node} over-allocated growing {r.job_id}")
        if r.after < r.before:
            shrinks += 1
            engines_back += r.before - r.after
        else:
            grows += 1
        j.view = views[r.job_id] = dataclasses.replace(j.view, demand=r.demand, placement=r.placement)
        set_speed(j, now, demand_gpus(r.demand))

    def stop(i: int, now: float) -> None:
        j = sim[i]
        assert j.view.placement is not None
        for node, g in j.view.placement.node_gpus:
            free[node] += g
        j.allocated_gpu_s += (now - j.segment_start) * j.held
        j.service_gpu_s += (now - j.run_start) * j.trace.gpus
        j.held = 0
        j.token += 1

    def preempt(i: int, now: float) -> None:
        nonlocal queued, preemptions
        j = sim[i]
        stop(i, now)
        # Progress survives only up to the last checkpoint of this run.
        j.remaining -= j.checkpoint_work
        j.state = "queued"
        j.preemptions += 1
        preemptions += 1
        j.queued_since = now
        queued += 1
        j.view = views[j.trace.id] = j.rebuilt_view(last_checkpoint_at=j.last_checkpoint, queued_at=now)
        if elastic:  # it comes back with the engines its spec asks for
            j.view = views[j.trace.id] = dataclasses.replace(
                j.view, demand=elastic_demand(j.trace.gpus, gpus_per_node)
            )

    beat_at = -1.0
    nominated: set[str] = set()
    while events:
        now, kind, _, i, token = heapq.heappop(events)
        if kind == _PASS:
            if token == 1:
                if now != beat_at:
                    continue  # superseded beat
            else:
                pass_pending = False
            for _round in range(4):
                if not queued and not elastic:
                    break
                snap = Snapshot(now, node_list, queues, tuple(views.values()))
                p0 = time.perf_counter()
                decision = policy(snap)
                pass_time += time.perf_counter() - p0
                passes += 1
                if check is not None:
                    violations.extend(check(snap, decision))
                for r in decision.resize:
                    resize(r, now)
                for job_id, reason in decision.preempt:
                    kind = preemption_kind(reason)
                    by_kind[kind] = by_kind.get(kind, 0) + 1
                    preempt(active[job_id], now)
                for job_id, placement in decision.admit:
                    start(active[job_id], placement, now)
                # Nominations live on the queued jobs until the next pass re-issues them.
                for job_id in nominated - decision.nominate.keys():
                    j = sim[active[job_id]]
                    if j.state == "queued":
                        j.view = views[job_id] = dataclasses.replace(j.view, nominated_nodes=frozenset())
                for job_id, held in decision.nominate.items():
                    j = sim[active[job_id]]
                    j.view = views[job_id] = dataclasses.replace(j.view, nominated_nodes=frozenset(held))
                nominated = set(decision.nominate)
                # preempted jobs and engines taken back stop at once here: their GPUs go to the jobs nominated
                # for them in another round
                if not decision.preempt and not any(r.after < r.before for r in decision.resize):
                    break
            if queued and beat_s > 0:
                beat_at = now + beat_s
                push(beat_at, _PASS, -1, 1)
            continue
        j = sim[i]
        if kind == _SUBMIT:
            j.state = "queued"
            j.queued_since = now
            active[j.trace.id] = i
            views[j.trace.id] = j.view
            queued += 1
        elif token != j.token:
            continue  # a finish or checkpoint of a run that was preempted
        elif kind == _CHECKPOINT:
            j.last_checkpoint = now
            j.checkpoint_work = j.work(now)
            j.view = views[j.trace.id] = j.rebuilt_view(
                state=JobStatus.RUNNING,
                placement=j.view.placement,
                started_at=j.view.started_at,
                last_checkpoint_at=now,
                queued_at=j.view.queued_at,
            )
            j.next_checkpoint = now + CHECKPOINT_INTERVAL_S
            if j.next_checkpoint < j.end:
                push(j.next_checkpoint, _CHECKPOINT, i, j.token)
            continue
        else:  # _FINISH
            stop(i, now)
            j.state = "done"
            j.completion = now
            del active[j.trace.id]
            del views[j.trace.id]
        if (queued or elastic) and not pass_pending:
            at = now if window_s <= 0 else math.ceil(now / window_s) * window_s
            push(at, _PASS, -1, 0)
            pass_pending = True

    metrics, per_tenant = compute_metrics(sim, nodes * gpus_per_node)
    metrics["preemptions"] = float(preemptions)
    if elastic:
        metrics["shrinks"] = float(shrinks)
        metrics["engines_back"] = float(engines_back)
        metrics["grows"] = float(grows)
    for kind, n in sorted(by_kind.items()):
        metrics[f"preemptions_{kind}"] = float(n)
    res = SimResult(
        policy_name,
        len(sim),
        metrics,
        per_tenant,
        time.perf_counter() - t0,
        time.process_time() - c0,
        passes,
        pass_time,
    )
    if violations:
        res.notes.extend(violations[:20])
    unfinished = sum(1 for j in sim if j.state != "done")
    if unfinished:
        res.notes.append(f"{unfinished} jobs never finished")
    return res


def preemption_kind(reason: str) -> str:
    """Which rule preempted a job, from the reason the policy gave (for the breakdown in --json)."""
    if "reclaims" in reason:
        return "reclaim"
    if "held at priority" in reason:
        return "class"
    if "goes before it" in reason:
        return "service"
    return "other"


def jain(values: list[float]) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one tenant gets everything."""
    if not values:
        return 1.0
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def compute_metrics(sim: list[_SimJob], capacity: int) -> tuple[dict[str, float], dict[str, float]]:
    done = [j for j in sim if j.state == "done"]
    n = len(done) or 1
    jct = [j.completion - j.trace.submit for j in done]
    beyond = [c - j.trace.duration for c, j in zip(jct, done, strict=True)]
    slow = [c / j.trace.duration for c, j in zip(jct, done, strict=True)]
    m: dict[str, float] = {
        "avg_jct_h": sum(jct) / n / 3600,
        "avg_beyond_h": sum(beyond) / n / 3600,
        "p95_queueing_h": _percentile([j.queued_total for j in done], 0.95) / 3600,
        # Starvation check: the most any one job spent queued in all, and its longest single wait.
        "max_queueing_h": max((j.queued_total for j in done), default=0.0) / 3600,
        "max_wait_h": max((j.longest_wait for j in done), default=0.0) / 3600,
        "mean_slowdown": sum(slow) / n,
    }
    for name, lo, hi in SIZE_CLASSES:
        cls = [s for s, j in zip(slow, done, strict=True) if lo <= j.trace.gpus <= hi]
        m[f"slowdown_{name}"] = sum(cls) / len(cls) if cls else float("nan")
    if done:
        t_first = min(j.trace.submit for j in sim)
        t_last = max(j.completion for j in done)
        span = max(1.0, t_last - t_first)
        m["utilisation"] = sum(j.allocated_gpu_s for j in sim) / (capacity * span)
        m["useful_utilisation"] = sum(j.trace.duration * j.trace.gpus for j in done) / (capacity * span)
    per_tenant: dict[str, list[float]] = {}
    for s, j in zip(slow, done, strict=True):
        per_tenant.setdefault(j.trace.tenant, []).append(s)
    tenant_mean = {t: sum(v) / len(v) for t, v in sorted(per_tenant.items())}
    m["jain_tenants"] = jain(list(tenant_mean.values()))
    return m, tenant_mean


_ROWS = (
    ("avg_jct_h", "avg job completion time (h)", "{:.3f}"),
    ("avg_beyond_h", "avg time beyond duration (h)", "{:.3f}"),
    ("p95_queueing_h", "p95 queueing delay (h)", "{:.3f}"),
    ("max_queueing_h", "max queueing delay (h)", "{:.3f}"),
    ("max_wait_h", "  longest single wait (h)", "{:.3f}"),
    ("mean_slowdown", "mean slowdown", "{:.3f}"),
    ("slowdown_1", "  slowdown, 1 GPU", "{:.3f}"),
    ("slowdown_2-8", "  slowdown, 2-8 GPUs", "{:.3f}"),
    ("slowdown_16+", "  slowdown, 16+ GPUs", "{:.3f}"),
    ("utilisation", "utilisation (allocated)", "{:.3f}"),
    ("jain_tenants", "Jain's fairness (tenants)", "{:.3f}"),
    ("preemptions", "preemptions", "{:.0f}"),
)
_ELASTIC_ROWS = (
    ("shrinks", "engine scale-ins (jobs shrunk)", "{:.0f}"),
    ("engines_back", "  engines taken back", "{:.0f}"),
    ("grows", "engine scale-outs (jobs grown)", "{:.0f}"),
)

# --elastic: the same RL-shaped trace under `ours` without and with elastic rollout
ELASTIC_VARIANTS = (
    ("rigid", {"elastic_shrink": False, "elastic_grow": False}),
    ("shrink", {"elastic_shrink": True, "elastic_grow": False}),
    ("shrink+grow", {"elastic_shrink": True, "elastic_grow": True}),
)


def render_table(results: list[SimResult]) -> str:
    width = max(len(label) for _, label, _ in _ROWS)
    cols = [r.policy for r in results]
    colw = max(14, *(len(c) for c in cols))
    lines = [f"{'metric':<{width}}  " + "  ".join(f"{c:>{colw}}" for c in cols)]
    lines.append("-" * len(lines[0]))
    rows = _ROWS + (_ELASTIC_ROWS if any("shrinks" in r.metrics for r in results) else ())
    for key, label, fmt in rows:
        lines.append(
            f"{label:<{width}}  "
            + "  ".join(f"{fmt.format(r.metrics.get(key, float('nan'))):>{colw}}" for r in results)
        )
    lines.append(
        f"{'replay wall time (s)':<{width}}  " + "  ".join(f"{r.wall_s:>{colw}.1f}" for r in results)
    )
    lines.append(f"{'replay CPU time (s)':<{width}}  " + "  ".join(f"{r.cpu_s:>{colw}.1f}" for r in results))
    lines.append(f"{'passes':<{width}}  " + "  ".join(f"{r.passes:>{colw}d}" for r in results))
    lines.append("")
    lines.extend(_FOOTNOTES)
    return "\n".join(lines)


_FOOTNOTES = (
    "completion time = completion - submit; time beyond duration = completion - submit - duration",
    "(queueing plus what preemptions cost); slowdown = completion time / duration; queueing delay =",
    "all the time a job spent queued (its first wait and any after a preemption); utilisation = GPU",
    "time held (lost work and restarts included) / (GPUs x first submit to last completion);",
    "Jain's fairness = Jain's index over the tenants' mean slowdowns (1: every tenant slowed alike).",
)


def parse_config(text: str) -> PolicyConfig:
    """'reservations=2,reclaim_after_s=600' -> PolicyConfig with those fields changed."""
    fields = {f.name: f.type for f in dataclasses.fields(PolicyConfig)}
    changes: dict[str, object] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"unknown PolicyConfig field {key!r}; known: {', '.join(fields)}")
        default = getattr(PolicyConfig(), key)
        if isinstance(default, bool):
            changes[key] = value.lower() in ("1", "true", "yes")
        elif default is None:
            changes[key] = None if value.lower() in ("", "none") else float(value)
        elif isinstance(default, tuple):
            changes[key] = tuple(float(v) for v in value.split("/") if v)
        else:
            changes[key] = type(default)(value)
    return dataclasses.replace(PolicyConfig(), **changes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scheduler_sim", description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--policies", default="fifo,fifo_backfill,ours")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N jobs")
    ap.add_argument(
        "--window", type=float, default=0.0, help="coalesce passes into windows of this many seconds"
    )
    ap.add_argument(
        "--beat", type=float, default=300.0, help="seconds between periodic passes while jobs wait"
    )
    ap.add_argument(
        "--config", default="", help="PolicyConfig overrides for ours, e.g. reservations=2,service_tiers=8/64"
    )
    ap.add_argument("--json", action="store_true", help="print the same numbers as JSON")
    ap.add_argument(
        "--elastic",
        action="store_true",
        help="jobs of 4-8 GPUs as elastic RL jobs; compare ours rigid, with shrink, with shrink and grow",
    )
    args = ap.parse_args(argv)
    trace = load_trace(args.trace.resolve(), args.limit)
    queues = tenant_queues(trace, NODES * GPUS_PER_NODE)
    results = []
    config = parse_config(args.config)
    runs = (
        [(f"ours {label}", "ours", dataclasses.replace(config, **knobs)) for label, knobs in ELASTIC_VARIANTS]
        if args.elastic
        else [(name.strip(), name.strip(), config) for name in args.policies.split(",")]
    )
    for label, name, cfg in runs:
        policy = functools.partial(POLICIES[name], config=cfg)
        results.append(
            simulate(
                trace,
                policy,
                policy_name=label,
                queues=queues,
                window_s=args.window,
                beat_s=args.beat,
                elastic=args.elastic,
            )
        )
    header = (
        f"{len(trace)} jobs from {args.trace.name} on {NODES} nodes x {GPUS_PER_NODE} GPUs; tenant = source cluster "
        f"(a stand-in: the trace has no user column); quotas proportional to tenants' GPU-hours; "
        f"checkpoint every {CHECKPOINT_INTERVAL_S / 60:.0f} min, restart {RESTART_DELAY_S / 60:.0f} min; "
        f"pass at {'every event instant' if args.window <= 0 else f'{args.window:.0f}-s windows'}"
        f" and every {args.beat:.0f} s while jobs wait"
        + (f"; ours with {args.config}" if args.config else "")
        + (
            "; jobs of 4-8 GPUs are elastic RL jobs (trainer half, 1-GPU engines 1..2x), progress in "
            "proportion to GPUs held"
            if args.elastic
            else ""
        )
    )
    if args.json:
        out = {
            "trace": str(args.trace),
            "jobs": len(trace),
            "pool": {"nodes": NODES, "gpus_per_node": GPUS_PER_NODE},
            "tenant": "source cluster (stand-in)",
            "quotas": {q.name: q.nominal_gpus for q in queues},
            "results": {
                r.policy: {
                    **r.metrics,
                    "per_tenant_mean_slowdown": r.per_tenant_slowdown,
                    "wall_s": r.wall_s,
                    "cpu_s": r.cpu_s,
                    "passes": r.passes,
                    "policy_s": r.pass_s,
                    "notes": r.notes,
                }
                for r in results
            },
        }
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(header)
        print(render_table(results))
        for r in results:
            for note in r.notes:
                print(f"[{r.policy}] {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
