"""Multi-process (gloo) worlds for the megatron tests, forked from one warm server process.

A rank started as a fresh interpreter (`mp.spawn`, or a script under `subprocess`) spends 4-5 s importing
torch, transformers and megatron-core on the 2-core CI machine before it does anything, and the megatron tests
start about forty such worlds. Here every rank is forked from a `multiprocessing` forkserver that imported
those once for the session (`PRELOAD`), so a world starts in well under a second. What a rank sees is what a
spawned one would: the test process's environment at the call (passed along: a forkserver's children inherit
*its* environment, from when it started), the test process's `sys.path`, a fresh process group. A rank that
raises fails the call with its traceback; a world that does not finish within `timeout` is killed.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as torch_mp

# imported once by the forkserver, before any rank is forked from it (nothing here starts a thread pool or a
# process group, so forking after it is safe)
PRELOAD = [
    "torch",
    "torch.distributed",
    "transformers",
    "megatron.core",
    "megatron.core.models.gpt",
    "megatron.core.distributed",
    "megatron.core.optimizer",
    "megatron.core.pipeline_parallel",
    "megatron.core.dist_checkpointing",
    "runtime.train.megatron.backend",
    "runtime.train.torch_backend",
]


def _rank(index: int, fn: Callable[..., Any], env: dict[str, str], args: tuple[Any, ...]) -> None:
    os.environ.clear()
    os.environ.update(env)
    fn(index, *args)


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    *,
    nprocs: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
    attempts: int = 3,
) -> None:
    """Run `fn(rank, *args)` in `nprocs` processes forked from the warm server (as `mp.spawn` would, with the
    current environment plus `env`); raises when a rank fails or the world outlives `timeout` seconds. `fn`
    must be importable by name (a module-level function).

    A rendezvous port (`free_port()` among `args`) is free when picked and can be taken before rank 0 binds
    it (under pytest-xdist a neighbour's gloo connections take ephemeral ports all the time): a world whose
    rank failed with EADDRINUSE on a port of `args` runs again on a new port, up to `attempts` times."""
    from runtime.train.megatron.parallel import free_port

    for attempt in range(1, attempts + 1):
        try:
            _spawn_once(fn, args, nprocs=nprocs, env=env, timeout=timeout)
            return
        except torch_mp.ProcessRaisedException as e:
            taken = re.search(r"port: (\d+), useIpv6: \w+, code: -98", str(e))
            port = int(taken.group(1)) if taken else None
            if attempt == attempts or port is None or port not in args:
                raise
            args = tuple(free_port() if a == port and not isinstance(a, bool) else a for a in args)


def _spawn_once(
    fn: Callable[..., Any], args: tuple[Any, ...], *, nprocs: int, env: dict[str, str] | None, timeout: float
) -> None:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # (read when the server starts: the first call of the session)
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    world = torch_mp.start_processes(
        _rank, args=(fn, environment, tuple(args)), nprocs=nprocs, join=False, start_method="forkserver"
    )
    deadline = time.monotonic() + timeout
    try:
        while not world.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{nprocs} ranks of {getattr(fn, '__name__', fn)} ran over {timeout:.0f} s"
                )
    finally:
        for process in world.processes:
            if process.is_alive():
                process.kill()
                process.join(5)
