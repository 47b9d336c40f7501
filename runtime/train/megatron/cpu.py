"""What megatron-core needs to run on a machine without CUDA; the only module of the backend that patches.

megatron-core (0.16 here, 0.19 on the GPU host) is written for CUDA: it allocates with `device="cuda"` or
`device=torch.cuda.current_device()`, moves tensors with `.cuda()`, and checks `param.type()` against
`'torch.cuda.FloatTensor'` (`clip_grad_by_total_norm_fp32`, `Float16OptimizerWithFloat16Params`,
`DistributedOptimizer`). On CPU (tests, CI, gloo) `install_cpu_shims()` makes all of that land on the CPU:

- `torch.cuda.current_device()` answers `torch.device("cpu")` instead of raising (megatron passes it as
  `device=`);
- a `TorchFunctionMode` (per thread, see below) maps every CUDA device argument of a torch call (`"cuda"`,
  `"cuda:N"`, `torch.device("cuda")`, an integer CUDA ordinal) to the CPU (also inside the backward of
  Python autograd functions, which torch would otherwise run outside the mode),
  makes `Tensor.cuda()` / `Tensor.pin_memory()` return the tensor (and `pin_memory=True` allocate plain memory), and, for calls made from megatron's own code
  only, reports a CPU tensor's `Tensor.type()` as its CUDA twin (`torch.FloatTensor` ->
  `torch.cuda.FloatTensor`): that one lie is what makes `clip_grad > 0` and the distributed optimizer run;
- for `optimizer-cpu-offload`, megatron's `HybridDeviceOptimizer` (the only caller that is answered so) sees
  the parameters it is given as device tensors (`Tensor.is_cuda`) and the host copies it makes of them
  (`.cpu()`, and what it derives from those with `detach` / `clone` / `float`) as host tensors, as on a GPU:
  it then runs its real split (gradients copied into host buffers, a CPU Adam on fp32 master copies, the
  results copied back into the model's shards) instead of looking up host copies it never made;
- `torch.cuda.get_rng_state()` returns the CPU generator's state (activation recompute saves it), and the
  CUDA lazy-call queue (where megatron's `_set_cuda_rng_state` parks its callbacks on a machine that never
  initialises CUDA) is bounded, so long CPU runs do not grow it without end;
- `torch.cuda.synchronize()` (pipeline point-to-point waits on it) returns at once, and `torch.cuda.Stream` /
  `Event` / `current_stream` / `default_stream` / `stream(...)` are CPU stand-ins that never wait (the MoE
  all-to-all dispatcher copies its split sizes on a side stream); the mode also turns tensor split sizes
  given to `torch.distributed.all_to_all_single` into lists (on CUDA megatron hands it host numpy arrays).

Only `torch.cuda` names and `torch.autograd.function.BackwardCFunction.apply` are replaced (private ones are
checked with `hasattr` first); megatron's own modules are not touched, except two names 0.16 gets wrong without TransformerEngine (`install_compat_shims`). Torch
function modes are thread-local: call `install_cpu_shims()` in every thread that runs megatron code (cheap,
idempotent per thread; `remove_cpu_shims()` undoes the mode). When CUDA is available it does nothing but
`install_compat_shims()` and returns False.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_patch_lock = threading.Lock()
_patched = False  # process-wide patches (torch.cuda attributes) applied
_local = threading.local()  # .mode: the mode pushed in this thread


def cuda_available() -> bool:
    return torch.cuda.is_available()


def install_compat_shims() -> None:
    """Fill names megatron-core 0.16 leaves undefined without TransformerEngine (whatever the device).

    0.16's `moe_utils` imports `te_general_gemm` only when TE imports and then tests `te_general_gemm is not
    None` in the router's gating linear, a NameError without TE; 0.19 binds it to None itself."""
    try:
        from megatron.core.transformer.moe import moe_utils
    except ImportError:  # pragma: no cover - megatron-core absent
        return
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    _te_version_checks_without_te()


def _te_version_checks_without_te() -> None:
    """0.16's `OptimizerConfig.__post_init__` asks `is_te_min_version("2.1.0")` under
    `use_precision_aware_optimizer` (which `optimizer-cpu-offload` requires) without asking whether TE is
    installed: `None >= Version` raises a TypeError. Without TE no minimum version is met: answer False
    (which turns `store_param_remainders` off, as megatron does for an old TE). Only the optimizer modules'
    imported name is wrapped; with TE installed the wrapper answers what megatron would."""
    from megatron.core import optimizer as optimizer_pkg
    from megatron.core import utils
    from megatron.core.optimizer import optimizer_config

    for module in (optimizer_config, optimizer_pkg):
        original = getattr(module, "is_te_min_version", None)
        if original is None or getattr(original, "_relax_compat_shim", False):
            continue

        def is_te_min_version(version: str, check_equality: bool = True, _original: Any = original) -> bool:
            return utils.get_te_version() is not None and _original(version, check_equality)

        is_te_min_version._relax_compat_shim = True  # type: ignore[attr-defined]
        module.is_te_min_version = is_te_min_version


def install_cpu_shims() -> bool:
    """Make megatron-core run on the CPU in this thread (and patch `torch.cuda` once per process).

    Returns True when the shims are active, False (and does nothing but `install_compat_shims`) when CUDA
    is available.
    """
    install_compat_shims()
    if cuda_available():
        return False
    _patch_torch_cuda()
    if getattr(_local, "mode", None) is None:
        mode = CudaToCpuMode()
        mode.__enter__()  # stays on this thread's mode stack for the life of the thread
        _local.mode = mode
    return True


def remove_cpu_shims() -> None:
    """Take this thread's mode off the stack again (tests that share a process with non-megatron code).
    The `torch.cuda` patches stay: on a machine without CUDA they only turn errors into CPU answers."""
    mode = getattr(_local, "mode", None)
    if mode is not None:
        mode.__exit__(None, None, None)
        _local.mode = None


def shims_active() -> bool:
    """Whether `install_cpu_shims()` has taken effect in this thread."""
    return getattr(_local, "mode", None) is not None


def _patch_torch_cuda() -> None:
    global _patched
    with _patch_lock:
        if _patched:
            return
        torch.cuda.current_device = _current_device
        if hasattr(torch.cuda, "random") and hasattr(torch.cuda.random, "get_rng_state"):
            torch.cuda.random.get_rng_state = _cpu_rng_state
        torch.cuda.get_rng_state = _cpu_rng_state
        # pipeline p2p waits for its sends with torch.cuda.synchronize(): CPU collectives are synchronous
        torch.cuda.synchronize = _no_sync
        # the MoE all-to-all dispatcher overlaps device-to-host copies on a side stream
        torch.cuda.Stream = CpuStream
        torch.cuda.Event = CpuEvent
        torch.cuda.current_stream = _default_stream
        torch.cuda.default_stream = _default_stream
        torch.cuda.stream = _stream_context
        _mode_in_custom_backward()
        # On a CPU-only build CUDA is never initialised, so every `torch.cuda._lazy_call` (megatron's
        # `_set_cuda_rng_state` on each recompute, `torch.cuda.manual_seed`) would be queued forever.
        queue = getattr(torch.cuda, "_queued_calls", None)
        if isinstance(queue, list):
            torch.cuda._queued_calls = collections.deque(queue, maxlen=64)
        _patched = True


def _current_device() -> torch.device:
    # A device rather than CUDA's ordinal: megatron passes it as `device=`, also inside autograd backward
    # functions, where no torch function mode applies (torch takes a mode off the stack while it handles a
    # call, and `Tensor.backward` is such a call).
    return _CPU


def _mode_in_custom_backward() -> None:
    """Run the backward of Python autograd functions (megatron's collectives, MoE permutations) under the
    mode too. Torch takes a mode off the stack while the mode handles a call, and `Tensor.backward` is such
    a call: without this, the backward pass would see CUDA placements unmapped."""
    from torch.autograd import function as autograd_function

    node = getattr(autograd_function, "BackwardCFunction", None)
    if node is None or not hasattr(node, "apply") or getattr(node.apply, "_relax_cpu_shim", False):
        return
    original = node.apply

    def apply(self, *args):
        if getattr(_local, "mode", None) is None:  # shims not installed in this thread
            return original(self, *args)
        with CudaToCpuMode():  # mapping twice (when a mode is already active) is harmless
            return original(self, *args)

    apply._relax_cpu_shim = True
    node.apply = apply


def _no_sync(device: Any = None) -> None:
    return None


class CpuEvent:
    """`torch.cuda.Event` on CPU: work is done when it is issued, so every wait returns at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuStream:
    """`torch.cuda.Stream` on CPU: one in-order queue, nothing to wait for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> CpuEvent:
        return event if event is not None else CpuEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


_DEFAULT_STREAM = CpuStream()


def _default_stream(device: Any = None) -> CpuStream:
    return _DEFAULT_STREAM


def _stream_context(stream: Any = None) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext(stream)


def _cpu_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.get_rng_state()


def _is_cuda_device(device: Any, *, allow_int: bool) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    # an index is a CUDA ordinal (what `torch.cuda.current_device()` hands to `device=`)
    return allow_int and isinstance(device, int) and not isinstance(device, bool)


_CPU = torch.device("cpu")
_IDENTITY_METHODS = {torch.Tensor.cuda, torch.Tensor.pin_memory}


_ALL_TO_ALL_SINGLE = getattr(torch.distributed, "all_to_all_single", None)


def _split_sizes_as_lists(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """megatron's all-to-all dispatcher moves its split sizes to the host as numpy arrays only when they
    live on a GPU; on CPU they stay tensors, which `all_to_all_single` does not take: make them lists."""

    def as_list(value: Any) -> Any:
        return value.tolist() if isinstance(value, torch.Tensor) else value

    args = tuple(as_list(a) if i in (2, 3) else a for i, a in enumerate(args))
    kwargs = {
        k: as_list(v) if k in ("output_split_sizes", "input_split_sizes") else v for k, v in kwargs.items()
    }
    return args, kwargs


def _called_from_megatron() -> bool:
    # frame 0: this function, 1: __torch_function__, 2: the caller of the torch function
    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", "")).startswith("megatron.")


_HYBRID_OPTIMIZER_MODULE = "megatron.core.optimizer.cpu_offloading."
_IS_CUDA = torch.Tensor.is_cuda.__get__  # a fresh (equal) method-wrapper at each access: compare with ==
_HOST_COPY_ATTR = "_relax_host_copy"
# tensor methods through which the hybrid optimizer derives its host copies (`.cpu()` makes one)
_HOST_DERIVING = {torch.Tensor.detach, torch.Tensor.clone, torch.Tensor.float, torch.Tensor.to}


def _called_from_hybrid_optimizer() -> bool:
    frame = sys._getframe(2)  # as in _called_from_megatron
    return str(frame.f_globals.get("__name__", "")).startswith(_HYBRID_OPTIMIZER_MODULE)


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA placement in torch calls to the CPU (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _IDENTITY_METHODS:
            return args[0]
        if func == _IS_CUDA and _called_from_hybrid_optimizer():
            return not getattr(args[0], _HOST_COPY_ATTR, False)
        if (func is torch.Tensor.cpu or func in _HOST_DERIVING) and _called_from_hybrid_optimizer():
            result = func(*args, **kwargs)  # already on the CPU: `.cpu()` / `.to("cpu")` answer the tensor
            if func is torch.Tensor.cpu or getattr(args[0], _HOST_COPY_ATTR, False):
                setattr(result, _HOST_COPY_ATTR, True)
            return result
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            if name.startswith("torch.") and not name.startswith("torch.cuda.") and _called_from_megatron():
                return "torch.cuda." + name[len("torch.") :]
            return name
        if func is _ALL_TO_ALL_SINGLE:
            args, kwargs = _split_sizes_as_lists(args, kwargs)
        if kwargs.get("pin_memory"):  # no pinned-memory allocator without an accelerator
            kwargs = {**kwargs, "pin_memory": False}
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device, allow_int=True):
            kwargs = {**kwargs, "device": _CPU}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1], allow_int=True):
            args = (args[0], _CPU, *args[2:])
        return func(*args, **kwargs)
