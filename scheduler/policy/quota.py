"""Queue quota bookkeeping for one pool: nominal GPUs, borrowing of idle quota, lending limits, shares."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.policy.types import Queue


class PoolQuota:
    """Usage per queue of one pool, with the two sums borrowing is checked against.

    A queue may always use up to its nominal GPUs (if they are physically free). Above nominal it
    borrows, and everything borrowed in the pool must fit in what is lendable: each queue's idle
    nominal GPUs up to its lending limit, plus pool GPUs no queue owns.
    """

    __slots__ = ("queues", "used", "_borrowed", "_lendable")

    def __init__(self, queues: Iterable[Queue], capacity: int, used: dict[str, int] | None = None) -> None:
        self.queues: dict[str, Queue] = {q.name: q for q in queues}
        used = used or {}
        self.used: dict[str, int] = {name: used.get(name, 0) for name in self.queues}
        owned = sum(q.nominal_gpus for q in self.queues.values())
        self._borrowed = sum(max(0, self.used[q.name] - q.nominal_gpus) for q in self.queues.values())
        self._lendable = max(0, capacity - owned) + sum(
            self._lends(q, self.used[q.name]) for q in self.queues.values()
        )

    @staticmethod
    def _lends(q: Queue, used: int) -> int:
        idle = max(0, q.nominal_gpus - used)
        return idle if q.lending_limit is None else min(idle, q.lending_limit)

    def add(self, queue: str, gpus: int) -> None:
        """Count GPUs a queue now holds (negative to give them back)."""
        q = self.queues[queue]
        old = self.used[queue]
        new = old + gpus
        self.used[queue] = new
        nom = q.nominal_gpus
        self._borrowed += max(0, new - nom) - max(0, old - nom)
        self._lendable += self._lends(q, new) - self._lends(q, old)

    # -- questions the policy asks ------------------------------------------------------------
    def within_nominal(self, queue: str, gpus: int) -> bool:
        return self.used[queue] + gpus <= self.queues[queue].nominal_gpus

    def admissible(self, queue: str, gpus: int) -> bool:
        """Would admitting `gpus` more keep the queue within its limits and the pool's borrowing?"""
        q = self.queues[queue]
        old = self.used[queue]
        new = old + gpus
        nom = q.nominal_gpus
        if new <= nom:
            return True
        if q.borrowing_limit is not None and new > nom + q.borrowing_limit:
            return False
        borrowed = self._borrowed + max(0, new - nom) - max(0, old - nom)
        lendable = self._lendable + self._lends(q, new) - self._lends(q, old)
        return borrowed <= lendable

    def could_ever_admit(self, queue: str, gpus: int) -> bool:
        """Would the job fit the queue's limits if the queue ran nothing else?"""
        q = self.queues[queue]
        return q.borrowing_limit is None or gpus <= q.nominal_gpus + q.borrowing_limit

    def at_borrowing_limit(self, queue: str, gpus: int) -> bool:
        q = self.queues[queue]
        return q.borrowing_limit is not None and self.used[queue] + gpus > q.nominal_gpus + q.borrowing_limit

    def borrowing(self, queue: str) -> int:
        """GPUs the queue holds above its nominal quota."""
        return max(0, self.used[queue] - self.queues[queue].nominal_gpus)

    def share(self, queue: str) -> float:
        """Dominant share over the resources scheduled (GPUs): usage / (weight x nominal)."""
        q = self.queues[queue]
        denom = q.weight * q.nominal_gpus
        if denom <= 0:
            return float("inf") if self.used[queue] else 0.0
        return self.used[queue] / denom
