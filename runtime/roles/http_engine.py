"""The `rollout` role's actor as a server speaking SGLang's HTTP protocol (`EngineKind.HTTP`), apart from the
other role actors (runtime/roles/actors.py) because it alone needs the SGLang client and httpx: the process of
a trainer, a critic or an in-process engine never imports them."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray
import torch
from ray.actor import ActorHandle

from runtime.roles.actors import _placement_group_id, _setup_process
from runtime.roles.logs import log_exceptions
from runtime.rollout.sglang.engine_actor import SGLangEngineActor

log = logging.getLogger(__name__)


@log_exceptions
class HttpEngineActor(SGLangEngineActor):
    """The `rollout` role as a server speaking SGLang's HTTP protocol (SGLang itself where it runs, else
    the built-in engine's server), driven through the SGLang client: same methods as `RolloutEngineActor`.
    `api_key`: the job's engine secret (`groups.start_roles`), required by the server on every route.
    `server_args`: the job's SGLang server arguments (`RolePlan.engine_args`), on the server's command line."""

    def __init__(
        self,
        hf_checkpoint: str,
        *,
        engine_index: int,
        num_threads: int = 1,
        max_batch_size: int = 256,
        log_sink: ActorHandle | None = None,
        api_key: str | None = None,
        server_args: tuple[str, ...] = (),
    ) -> None:
        _setup_process(num_threads, log_sink, f"actor:rollout{engine_index}")
        started = time.perf_counter()
        super().__init__(
            hf_checkpoint,
            engine_index=engine_index,
            num_threads=num_threads,
            max_batch_size=max_batch_size,
            api_key=api_key,
            server_args=server_args,
        )
        log.info(
            "rollout engine %d (%s server at %s) ready in %.1fs (pid %d)",
            engine_index,
            self.launcher,
            self.address,
            time.perf_counter() - started,
            os.getpid(),
        )

    def ready(self) -> dict[str, Any]:
        info = super().ready()
        info.update(
            role="rollout",
            threads=torch.get_num_threads(),
            placement_group=_placement_group_id(),
            node_id=ray.get_runtime_context().get_node_id(),  # where a health check reaps its server
        )
        return info
