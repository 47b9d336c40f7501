"""Launches and supervises job drivers as Ray jobs (the only part of runtime the scheduler calls)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

log = logging.getLogger(__name__)


class RayJobStatus(StrEnum):
    """Ray's `JobStatus` of a Ray job (its wire values), spelled out so that callers need not import ray."""

    PENDING = "PENDING"  # submitted; the entrypoint has not started
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"  # stopped on request (`stop_job`)
    SUCCEEDED = "SUCCEEDED"  # the entrypoint exited 0
    FAILED = "FAILED"  # the entrypoint exited non-zero, or its supervisor or node died

    def is_terminal(self) -> bool:
        return self in (RayJobStatus.STOPPED, RayJobStatus.SUCCEEDED, RayJobStatus.FAILED)


# The members by their older names (tests and callers of the launcher use them).
RAY_PENDING = RayJobStatus.PENDING
RAY_RUNNING = RayJobStatus.RUNNING
RAY_STOPPED = RayJobStatus.STOPPED
RAY_SUCCEEDED = RayJobStatus.SUCCEEDED
RAY_FAILED = RayJobStatus.FAILED


@dataclass(frozen=True)
class RayJobInfo:
    status: RayJobStatus  # a plain string of one of its values is taken as that member
    message: str | None
    # Ray's JobErrorType of a FAILED job (e.g. JOB_ENTRYPOINT_COMMAND_ERROR, JOB_SUPERVISOR_ACTOR_DIED) and the
    # entrypoint's exit code (negative: killed by that signal; 128+N from the shell: killed by signal N)
    error_type: str | None = None
    exit_code: int | None = None
    ended_at: float | None = None  # when it ended (epoch seconds), for an ended job

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", RayJobStatus(self.status))


@dataclass(frozen=True)
class RayNode:
    """One node of a pool's Ray cluster as Ray lists it: its id (also its `ray.io/node-id` label), name and IP,
    whether Ray holds it alive, what it advertises (`GPU`, `CPU`, custom resources) and its labels."""

    node_id: str
    name: str
    ip: str
    alive: bool
    resources: dict[str, float]
    labels: dict[str, str]


def driver_entrypoint(python: str, job_id: str, api_url: str) -> str:
    """The shell command of a job's driver on the cluster. No credential on it: the driver exchanges the
    bootstrap secret of its environment for its token first thing (runtime/bootstrap.py)."""
    return f"{python} -m runtime.bootstrap --job-id {job_id} --api-url {api_url}"


def submission_id(job_id: str, attempt: int) -> str:
    # One Ray job per attempt: Ray refuses a second submission with the same id, which makes a
    # re-delivered launch task harmless, and a relaunch after preemption gets a fresh id.
    return f"{job_id}-a{attempt}"


class RayJobLauncher:
    """Ray Jobs API client of one cluster (its dashboard address, e.g. http://127.0.0.1:8265).

    `token`: the cluster's Ray auth token (`RAY_AUTH_MODE=token`), sent as `Authorization: Bearer` on
    every call of this client only, whatever this process's own `RAY_AUTH_MODE` says (one worker talks
    to several pools, each with its token). None: no header (a cluster without auth)."""

    def __init__(self, address: str, token: str | None = None) -> None:
        from ray.job_submission import JobSubmissionClient

        self.address = address
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._client = JobSubmissionClient(address, headers=headers)

    def submit(
        self,
        sub_id: str,
        entrypoint: str,
        *,
        env: dict[str, str],
        metadata: dict[str, str],
        agent_wait_s: float = 60.0,
    ) -> bool:
        """Submit; True when submitted now, False when Ray already had it (idempotent)."""
        deadline = time.monotonic() + agent_wait_s
        while True:
            try:
                self._client.submit_job(
                    entrypoint=entrypoint,
                    submission_id=sub_id,
                    runtime_env={"env_vars": env},
                    metadata=metadata,
                )
                return True
            except RuntimeError as err:
                if "already exists" in str(err):
                    return False
                # A head that just started answers before its node agent can take jobs.
                if "No available agent" in str(err) and time.monotonic() < deadline:
                    time.sleep(1.0)
                    continue
                raise

    def status(self, sub_id: str) -> RayJobInfo | None:
        """None when Ray does not know the job."""
        try:
            info = self._client.get_job_info(sub_id)
        except RuntimeError as err:
            if "does not exist" in str(err) or "404" in str(err):
                return None
            raise
        error_type = getattr(info, "error_type", None)
        end_ms = getattr(info, "end_time", None)
        return RayJobInfo(
            status=RayJobStatus(str(info.status.value if hasattr(info.status, "value") else info.status)),
            message=info.message,
            error_type=str(getattr(error_type, "value", error_type)) if error_type else None,
            exit_code=getattr(info, "driver_exit_code", None),
            ended_at=end_ms / 1000 if end_ms else None,
        )

    def stop(self, sub_id: str) -> bool:
        try:
            return bool(self._client.stop_job(sub_id))
        except RuntimeError as err:
            if "does not exist" in str(err) or "404" in str(err):
                return False
            raise

    def nodes(self) -> list[RayNode]:
        """Every node Ray knows, alive or dead: Ray's state API (`GET /api/v0/nodes`) through this client, so
        with its address and its token."""
        response = self._client._do_request("GET", "/api/v0/nodes?limit=10000&detail=1")
        if response.status_code != 200:
            raise RuntimeError(f"GET /api/v0/nodes: HTTP {response.status_code} {response.text[:200]}")
        return [
            RayNode(
                node_id=str(row["node_id"]),
                name=str(row.get("node_name") or row.get("node_ip") or row["node_id"]),
                ip=str(row.get("node_ip") or ""),
                alive=row.get("state") == "ALIVE",
                resources={k: float(v) for k, v in (row.get("resources_total") or {}).items()},
                labels={k: str(v) for k, v in (row.get("labels") or {}).items()},
            )
            for row in response.json()["data"]["result"]["result"]
        ]

    def logs_tail(self, sub_id: str, lines: int = 200) -> list[str]:
        try:
            text = self._client.get_job_logs(sub_id)
        except RuntimeError:
            return []
        return text.splitlines()[-lines:]


@lru_cache(maxsize=32)
def launcher_for(address: str, token: str | None = None) -> RayJobLauncher:
    """One client per (cluster, token): a token put in place or rotated gets a new client."""
    return RayJobLauncher(address, token)
