"""The permission table (scheduler/domain/roles.py): pinned here, so a change to who may do what is a
visible change to this test."""

from __future__ import annotations

import pytest

from scheduler.domain.errors import PermissionDenied
from scheduler.domain.roles import PERMISSIONS, Action, Role, allows
from scheduler.services.auth import Principal

TABLE = {
    #                     admin team_admin member viewer
    Action.JOB_READ: (True, True, True, True),
    Action.JOB_VALIDATE: (True, True, True, True),
    Action.JOB_SUBMIT: (True, True, True, False),
    Action.JOB_CANCEL: (True, True, True, False),
    Action.TEAM_READ: (True, True, True, True),
    Action.POOL_READ: (True, True, True, True),
    Action.KEY_MANAGE: (True, True, False, False),
    Action.CLUSTER_READ: (True, False, False, False),
    Action.PLATFORM_ADMIN: (True, False, False, False),
    Action.AUDIT_READ: (True, False, False, False),
    Action.METRICS_READ: (True, False, False, False),
}
ROLES = (Role.ADMIN, Role.TEAM_ADMIN, Role.MEMBER, Role.VIEWER)


def test_every_action_is_in_the_table() -> None:
    assert set(PERMISSIONS) == set(Action) == set(TABLE)


@pytest.mark.parametrize("action", list(Action))
def test_who_may_do_what(action: Action) -> None:
    assert tuple(allows(role, action) for role in ROLES) == TABLE[action]


def test_an_unknown_role_may_do_nothing() -> None:
    assert not any(allows("superuser", a) for a in Action)


def test_require_refuses_naming_the_roles_that_may() -> None:
    viewer = Principal(key_id="key_v", role="viewer", team_id="team_a")
    with pytest.raises(PermissionDenied) as err:
        viewer.require(Action.JOB_SUBMIT)
    assert err.value.details == {"action": "job.submit", "roles": ["admin", "member", "team_admin"]}
    viewer.require(Action.JOB_READ)
    assert (
        viewer.can_see_team("team_a") and not viewer.can_see_team("team_b") and not viewer.can_see_team(None)
    )
    assert Principal(key_id="key_a", role="admin", team_id=None).can_see_team("team_b")
