"""Checkpoints of a running job: when to save, blocking or in the background (`async-save`), HF exports,
registering each with the platform, and retention (`max-actor-ckpt-to-keep`, `rotate-ckpt`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from runtime.access import owner_of
from runtime.reporter import EventKind, Reporter
from runtime.roles.groups import TrainGroup
from runtime.spec import RuntimeSpec
from runtime.train.checkpoint import CheckpointRecord, RetentionPolicy, prune_checkpoints, render_hf_path

log = logging.getLogger(__name__)


@dataclass
class CheckpointManager:
    spec: RuntimeSpec
    reporter: Reporter
    train: TrainGroup | None
    last_saved: int | None = None
    last_exported: int | None = None

    @property
    def policy(self) -> RetentionPolicy:
        s = self.spec
        return RetentionPolicy(
            keep=s.max_actor_ckpt_to_keep, rotate=s.rotate_ckpt, save_interval=s.save_interval
        )

    def due(self, rollout_id: int) -> bool:
        """`save-interval` steps, or every step with `rotate-ckpt` (retention then thins them out)."""
        interval = self.spec.save_interval
        if not self.spec.save:
            return False
        return self.spec.rotate_ckpt or bool(interval and (rollout_id + 1) % interval == 0)

    def save(self, rollout_id: int, extra_state: dict[str, Any], *, blocking: bool | None = None) -> None:
        """Checkpoint as `iter_<rollout_id>` (Relax numbering: resume starts at rollout_id + 1) and, with
        `save-hf`, export the HF folder too. `async-save` writes in the background unless `blocking`."""
        if self.spec.save and self.train is not None and self.last_saved != rollout_id:
            wait = not self.spec.async_save if blocking is None else blocking
            record = self.train.save_checkpoint(self.spec.save, rollout_id, extra_state, blocking=wait)
            self.last_saved = rollout_id
            if record is not None:
                self._register(record)
                self._prune()
        self.export_hf(rollout_id)
        self.collect()

    def collect(self, *, wait: bool = False) -> None:
        """Register background saves that finished (all of them, with `wait`)."""
        if self.train is None or not self.spec.async_save:
            return
        records = self.train.finished_saves(wait=wait)
        for record in records:
            self._register(record)
        if records:
            self._prune()

    def export_hf(self, rollout_id: int) -> None:
        if self.spec.save_hf and self.train is not None and self.last_exported != rollout_id:
            path = render_hf_path(self.spec.save_hf, rollout_id)
            self._register(self.train.export_hf(str(path), rollout_id))
            self.last_exported = rollout_id

    def _register(self, record: CheckpointRecord) -> None:
        self.reporter.checkpoint(record)
        kind = EventKind.HF_EXPORTED if record.format == "hf" else EventKind.CHECKPOINT_SAVED
        self.reporter.event(kind, f"step {record.step}: {record.path} ({record.size_bytes} B)")
        log.info(
            "%s checkpoint of step %d at %s (%d B)",
            record.format,
            record.step,
            record.path,
            record.size_bytes,
        )

    def _prune(self) -> None:
        if self.spec.save:
            for folder in prune_checkpoints(self.spec.save, self.policy, owner=owner_of(self.spec)):
                self.reporter.event(EventKind.CHECKPOINT_REMOVED, str(folder))
                log.info("removed checkpoint %s (retention)", folder)
