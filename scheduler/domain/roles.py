"""Roles of API keys and what each may do: the one permission table of the platform (no I/O).

Services check it through `Principal.require(action)` (scheduler/services/auth.py) before they read or
change anything; routes never decide permissions themselves. Team-scoped roles act on their own team
only: a resource of another team is answered as missing (404), never as forbidden, so that nothing
tells a caller whether it exists. docs/security.md explains the table;
tests/integration/test_isolation.py checks every route against it.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    ADMIN = "admin"  # operators of the platform: every team, every object; keys without a team
    TEAM_ADMIN = "team_admin"  # one team: what a member does, plus the team's keys (never admin keys)
    MEMBER = "member"  # one team: submit, cancel and read the team's jobs
    VIEWER = "viewer"  # one team: read-only (jobs, metrics, logs, queues) and dry runs of specs


class Action(StrEnum):
    JOB_READ = "job.read"  # the team's jobs: list, get, events, metrics, logs, outputs, stream
    JOB_VALIDATE = "job.validate"  # dry run of a spec (stores nothing)
    JOB_SUBMIT = "job.submit"
    JOB_CANCEL = "job.cancel"  # any job of the team
    TEAM_READ = "team.read"  # the team, its grants, its queues with their usage, priority classes
    POOL_READ = "pool.read"  # pools and nodes with capacity; other teams' jobs only as GPU counts
    KEY_MANAGE = "key.manage"  # create, list and revoke keys (a team admin: the team's non-admin keys)
    CLUSTER_READ = "cluster.read"  # Ray addresses, every team's jobs on the nodes, every queue
    PLATFORM_ADMIN = "platform.admin"  # teams and their grants, pools, nodes, queues, priority classes
    AUDIT_READ = "audit.read"  # the audit log of every mutating call
    METRICS_READ = "metrics.read"  # Prometheus /metrics (also RELAX_METRICS_TOKEN)


_ALL = frozenset(Role)
_WRITERS = frozenset({Role.ADMIN, Role.TEAM_ADMIN, Role.MEMBER})
_ADMIN = frozenset({Role.ADMIN})

# action -> the roles that may do it (on their own team, for the team-scoped roles)
PERMISSIONS: dict[Action, frozenset[Role]] = {
    Action.JOB_READ: _ALL,
    Action.JOB_VALIDATE: _ALL,
    Action.JOB_SUBMIT: _WRITERS,
    Action.JOB_CANCEL: _WRITERS,
    Action.TEAM_READ: _ALL,
    Action.POOL_READ: _ALL,
    Action.KEY_MANAGE: frozenset({Role.ADMIN, Role.TEAM_ADMIN}),
    Action.CLUSTER_READ: _ADMIN,
    Action.PLATFORM_ADMIN: _ADMIN,
    Action.AUDIT_READ: _ADMIN,
    Action.METRICS_READ: _ADMIN,
}

# Roles bound to one team (their keys must name it).
TEAM_ROLES = frozenset({Role.TEAM_ADMIN, Role.MEMBER, Role.VIEWER})
# Roles a team admin may give to keys of their own team.
GRANTABLE_BY_TEAM_ADMIN = TEAM_ROLES


def allows(role: str, action: Action) -> bool:
    """Whether a key of `role` may do `action` at all (an unknown role may do nothing)."""
    try:
        return Role(role) in PERMISSIONS[action]
    except ValueError:
        return False
