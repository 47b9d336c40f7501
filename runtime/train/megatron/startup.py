"""How a megatron-core rank process imports megatron-core: without what a rank never uses.

`import megatron.core` loads, besides megatron itself:

- `wandb` (`megatron.core.timers`, `megatron.core.inference.contexts.dynamic_context`) and
  `torch.utils.tensorboard` (`megatron.core.timers`; it brings tensorboard's tensorflow stub and boto3), each
  inside `try: ... except ImportError`, for megatron's own loggers. A Relax rank never logs there: the job's
  trackers (`--use-tensorboard`, `--use-wandb`, runtime/trackers.py) run in the driver only, and a rank's
  metrics go back to the driver in `train_step`'s answer. ~0.8 s of CPU per rank.
- `torch._inductor.compile_fx` and what it imports (torch's code generation), because megatron's `jit_fuser`
  (`megatron.core.jit`) is `torch.compile`, applied as a decorator to its fused activations while its modules
  import. On CPU Relax turns every megatron fusion off (`model.transformer_config`, `kernels.cuda_fusions`):
  nothing compiles there, and the helpers megatron calls unfused anyway run the same Python eagerly.
  ~0.5 s of CPU per rank. On CUDA `jit_fuser` stays `torch.compile`.

`prepare_rank_process()` makes both choices, once, at the start of a process that runs megatron-core ranks
(`TrainActor`, `CriticActor` under `--train-backend megatron`), before megatron-core is imported: `wandb` and
`torch.utils.tensorboard` are marked absent (`sys.modules[name] = None`: importing them raises ImportError,
which megatron catches), and, without CUDA, megatron's own switch `megatron.core.jit.disable_jit_fuser()` is
applied while megatron-core's modules import (`torch.compile` answers the function undecorated for that
import only, then is restored; `disable_jit_fuser` then keeps megatron's modules imported later eager).

Only a Ray worker process is changed (`ray.get_runtime_context().worker.mode`): the driver (which logs to W&B
and TensorBoard) and the pytest process (whose unit tests run megatron-core, and W&B, in process) never are,
nor is a process that had already imported megatron-core (nor a logger it had already imported).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator

import torch

# megatron's loggers; a rank never logs there (its metrics go to the driver, whose trackers log them)
UNUSED_IN_RANKS = ("wandb", "torch.utils.tensorboard")

_prepared = False
log = logging.getLogger(__name__)


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (an actor's or a task's), not a driver or a plain process."""
    if "ray" not in sys.modules:
        return False
    import ray

    if not ray.is_initialized():
        return False
    return ray.get_runtime_context().worker.mode == ray.WORKER_MODE


@contextlib.contextmanager
def _eager_jit_fuser() -> Iterator[None]:
    """While megatron-core imports: `torch.compile(fn)` answers `fn` (megatron's `jit_fuser` is bound to it
    at import, and decorates with it), and `megatron.core.jit.disable_jit_fuser()` is applied before the
    restore, so megatron modules imported later are left eager too."""
    compile_fn = torch.compile

    def eager(model=None, **_kwargs):
        return model if model is not None else (lambda fn: fn)

    torch.compile = eager  # type: ignore[assignment]
    try:
        yield
        from megatron.core import jit

        jit.disable_jit_fuser()
    finally:
        torch.compile = compile_fn


def prepare_rank_process() -> bool:
    """Import megatron-core as a rank process needs it (see the module's docstring). Does nothing (and returns
    False) outside a Ray worker, when megatron-core is already imported, or the second time; returns True
    when it imported megatron-core."""
    global _prepared
    if _prepared or not in_ray_worker():
        return False
    _prepared = True
    if "megatron.core" in sys.modules:
        return False
    for name in UNUSED_IN_RANKS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # absent, unless already imported
    started = time.process_time()
    guard = contextlib.nullcontext() if torch.cuda.is_available() else _eager_jit_fuser()
    with guard:
        import megatron.core  # noqa: F401
    log.info(
        "megatron-core imported for a rank in %.1fs of CPU: %s", time.process_time() - started, summary()
    )
    return True


def summary() -> str:
    """What this process's megatron-core left out: the loggers marked absent, whether `jit_fuser` is eager
    and torch's code generation (`torch._inductor.compile_fx`) was left unimported."""
    from megatron.core import jit

    absent = [name for name in UNUSED_IN_RANKS if name in sys.modules and sys.modules[name] is None]
    eager = jit.jit_fuser is jit.noop_decorator
    codegen = "torch._inductor.compile_fx" in sys.modules
    return f"absent {','.join(absent) or 'none'}; jit_fuser {'eager' if eager else 'compiled'}; " + (
        "compile_fx imported" if codegen else "compile_fx not imported"
    )
