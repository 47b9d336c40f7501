"""The scheduling policy: pure functions from a Snapshot of plain data to a Decision."""

from scheduler.policy.config import PolicyConfig
from scheduler.policy.policy import POLICIES, fifo, fifo_backfill, schedule
from scheduler.policy.types import (
    Assignment,
    Decision,
    Gang,
    JobView,
    Node,
    Placement,
    PriorityClass,
    Queue,
    QueueUsage,
    Snapshot,
    WaitInfo,
)

__all__ = [
    "POLICIES",
    "Assignment",
    "Decision",
    "Gang",
    "JobView",
    "Node",
    "Placement",
    "PolicyConfig",
    "PriorityClass",
    "Queue",
    "QueueUsage",
    "Snapshot",
    "WaitInfo",
    "fifo",
    "fifo_backfill",
    "schedule",
]
