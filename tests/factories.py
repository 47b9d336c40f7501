"""Plain factory functions for tests: a bootstrapped platform and small valid specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.db.engine import Database
from scheduler.services.paths import team_area
from scheduler.services.platform import LocalPool, ensure_admin_key, ensure_local_pool, ensure_team


def seed_area(artifact_root: Path, team_id: str) -> Path:
    """What `grpo_spec()` reads, in the team's area (`artifacts://`): a model folder and a prompt file."""
    area = team_area(artifact_root, team_id)
    (area / "models" / "tiny").mkdir(parents=True, exist_ok=True)
    (area / "data").mkdir(parents=True, exist_ok=True)
    (area / "data" / "train.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    return area


def bootstrap(
    db: Database, home: Path, *, slots: int = 2, ray_address: str | None = "http://127.0.0.1:9"
) -> str:
    """Default team, pool `local` with one node of `slots`, default queue; returns the admin key. The
    default team's area (under `home`/artifacts, the default artifact root) holds `grpo_spec()`'s inputs."""
    with db.session() as s:
        team = ensure_team(s, "default")
        seed_area(home / "artifacts", team.id)
        ensure_local_pool(
            s,
            LocalPool(
                name="local",
                accelerator="cpu",
                node="node-0",
                slots=slots,
                ray_address=ray_address,
                python=None,
            ),
            team=team,
        )
        return ensure_admin_key(s, home / "admin.key")


def grpo_spec(**overrides: Any) -> dict[str, Any]:
    """A small valid Relax GRPO config (hyphenated keys, as users write them)."""
    spec: dict[str, Any] = {
        "train-backend": "torch",
        "hf-checkpoint": "artifacts://models/tiny",  # the submitting team's area (seed_area)
        "prompt-data": "artifacts://data/train.jsonl",
        "input-key": "prompt",
        "label-key": "label",
        "rm-type": "math",
        "rollout-batch-size": 4,
        "n-samples-per-prompt": 4,
        "rollout-max-response-len": 8,
        "rollout-temperature": 1.0,
        "global-batch-size": 16,
        "num-rollout": 3,
        "lr": 1e-3,
        "advantage-estimator": "grpo",
        "colocate": True,
        "resource": {"actor": [1, 1], "rollout": [1, 1]},
    }
    spec.update(overrides)
    return spec


def make_broker_app(broker_url: str, home: Path):  # type: ignore[no-untyped-def]
    """A real Celery app on a real broker, as the API process builds it (producer only)."""
    from scheduler.celery_app import make_celery
    from scheduler.settings import CelerySettings, Settings

    settings = Settings(home=home, celery=CelerySettings(broker_url=broker_url))
    return make_celery(settings)


def drain_queue(app, queue: str, *, wait: float = 0.5) -> list[tuple[str, list]]:  # type: ignore[no-untyped-def]
    """Take every message off a broker queue: [(task name, args)]."""
    out = []
    with app.connection_for_read() as conn:
        q = conn.SimpleQueue(queue, no_ack=True)
        try:
            while True:
                try:
                    msg = q.get(timeout=wait)
                except q.Empty:
                    break
                out.append((msg.headers["task"], list(msg.payload[0])))
        finally:
            q.close()
    return out


def make_job(
    db: Database,
    *,
    queue: str = "default",
    gpus_per_replica: int = 1,
    replicas: int = 1,
    priority_class: str = "normal",
    name: str = "job",
    colocated_rollout: bool = True,
    artifact_root: Path = Path("/tmp/relax-test-artifacts"),
) -> str:
    """A QUEUED job with the given demand, stored directly: for tests of scheduling that need demands
    the CPU backend would refuse at submission (it trains on one device)."""
    import sqlalchemy as sa

    from scheduler.db.models import Job, JobEvent, PriorityClass, Queue
    from scheduler.domain.ids import new_id

    groups = [
        {
            "role": "actor",
            "replicas": replicas,
            "gpus_per_replica": gpus_per_replica,
            "one_node": True,
            "shares_with": None,
        }
    ]
    if colocated_rollout:
        groups.append(
            {
                "role": "rollout",
                "replicas": replicas,
                "gpus_per_replica": gpus_per_replica,
                "one_node": True,
                "shares_with": "actor",
            }
        )
    with db.session() as s:
        q = s.get(Queue, queue)
        pc = s.get(PriorityClass, priority_class)
        assert q is not None and pc is not None
        job_id = new_id("job")
        s.add(
            Job(
                id=job_id,
                name=name,
                team_id=q.team_id,
                queue=q.name,
                pool=q.pool,
                status="QUEUED",
                priority_class=pc.name,
                priority=pc.value,
                preemptible=pc.preemptible,
                labels={},
                spec={},
                submitted={},
                demand={
                    "groups": groups,
                    "total_gpus": replicas * gpus_per_replica,
                    # the rest of a demand as jobspec.demand.ResourceDemand has it (the API returns it typed)
                    "num_gpus_per_node": max(gpus_per_replica, 8),
                    "colocated": colocated_rollout,
                    "nodes_needed": -(-replicas * gpus_per_replica // max(gpus_per_replica, 8)),
                    "cpu_roles": [],
                    "summary": "",
                    "legacy_layout": False,
                },
                total_gpus=replicas * gpus_per_replica,
                output_dir=str(team_area(artifact_root, q.team_id) / "jobs" / job_id),
            )
        )
        s.flush()
        s.add(JobEvent(job_id=job_id, kind="transition", to_status="QUEUED", reason="test factory"))
        assert s.scalar(sa.select(sa.func.count()).select_from(Job).where(Job.id == job_id)) == 1
    return job_id


def two_team_gpu_pool(db: Database) -> None:
    """Pool h200 of 4 nodes x 8 GPUs; teams and queues math and vision on it, 16 nominal GPUs each (created as
    the admin API creates them)."""
    from scheduler.services.auth import Principal
    from scheduler.services.platform import create_pool, create_queue, create_team

    admin = Principal(key_id="key_test", role="admin", team_id=None)
    with db.session() as s:
        create_pool(
            s,
            admin,
            name="h200",
            accelerator="h200",
            ray_address=None,
            python=None,
            nodes=[{"name": f"n{i}", "gpus": 8} for i in range(4)],
        )
        for team in ("math", "vision"):
            create_team(s, admin, team)
            create_queue(
                s,
                admin,
                name=team,
                pool="h200",
                team=team,
                nominal_gpus=16,
                borrowing_limit=None,
                lending_limit=None,
                weight=1.0,
            )
