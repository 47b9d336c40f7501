"""`FastGenEngine`: continuous batching over a static per-slot KV cache, decode steps as CUDA graphs.

How it runs (see the package docstring for how to select it):

- **Cache.** `kv[L, 2, S, Hkv, T, D]`: S slots of T positions. A running sequence owns one slot and, in a
  decode step, the batch row of the same index, so decode reads each slot's keys as a strided view (no
  gather). New requests take the lowest free slots; when the highest busy slot would put the batch in a
  larger size bucket than the number of running sequences needs, the highest ones move down
  (compaction: one copy of their cache rows). S and T are sized from the work when the engine is idle
  (`max_batch_size` caps S; `max_seq_len` fixes T).
- **Scheduler.** Every step: apply aborts, admit waiting requests into free slots (batched prefill,
  right-padded, at most `max_prefill_tokens` padded tokens per forward; a longer prompt is prefilled
  alone in chunks; requests of one admission with the same prompt token ids, e.g. GRPO's n samples of
  a prompt, share one prefill and get a copy of its cache rows: prefix sharing), launch one decode
  step for every running slot, then read back the results of the oldest steps until `pipeline_depth`
  steps stay in flight (default 2 on CUDA, 1 on CPU; `RELAX_FASTGEN_DEPTH`), so the host's bookkeeping
  overlaps the device's work and a late host absorbs jitter. A sequence that finished is released
  before the next launch once its end is read (a stop id, a stop string: the steps still in flight
  carry a token of it that is dropped) or at once when its budget's last token is launched; decode
  never waits for the longest one.
- **Host work per step** is kept proportional to what changes: the running count, the highest busy slot,
  each request's launched count (a global launch counter minus the request's start) and the steps at
  which budgets end are kept up to date on admission and release, the shared-prefix layout is cached until
  the slot assignment changes, results land in reused (pinned, on CUDA) host buffers, and reading a step
  back appends each row's token and checks only the rows that may end: a token among the stop ids of any
  request, a budget's last token, a request with stop strings (every row while an abort is draining).
- **Decode.** One token per slot `0..B-1` with B the batch-size bucket; attention reads the first W
  positions, W the longest live length rounded up to `window_quantum` (`decode_attention`: "flex" =
  torch's compiled flex_attention, a split-KV decoding kernel, with a per-row length mask; "sdpa" =
  SDPA over that window with a length mask and the query heads of each KV head grouped into one query
  block; "bmm" = the same with two matmuls and a softmax; "sdpa_full" = the whole cache, one window;
  "triton" = one Triton kernel per layer reading each row to its own length, shared prefix included:
  `triton_attention.py`, so no window and one graph per batch bucket and sampler mode).
  On CUDA each (B, W, sampler mode) is captured once as a CUDA graph, lazily; on CPU the same function
  runs eagerly.
- **Sampling** (`sampler.py`): on device, per-row temperature / top-k / top-p / seed / min_new_tokens
  (inverse CDF in two levels: vocabulary blocks, then one block; on CUDA the plain mode's pass over the
  vocabulary is one Triton kernel, `triton_sampler.py`);
  the log-prob of each token under softmax(logits / T) as `TorchRolloutEngine` reports it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.devices import Device, DeviceKind
from runtime.rollout.fastgen import triton_attention, triton_sampler
from runtime.rollout.fastgen.model import (
    Decoder,
    FlatWeights,
    ModelConfig,
    load_hf_checkpoint,
    maybe_compile,
)
from runtime.rollout.fastgen.sampler import SamplerMode, SlotState, mix_seed, sample
from runtime.rollout.params import FinishReason, GenerationResult, SamplingParams

# on CUDA: "triton" where triton is importable (the fastest measured, docs/benchmarks.md), else "sdpa"
# (the fastest of the others on the H200; flex: ~8x slower per layer call)
DEFAULT_DECODE_ATTENTION = "sdpa"


def batch_buckets(limit: int) -> list[int]:
    """Decode batch sizes a graph is captured for: 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, ... and `limit`."""
    sizes = {1, 2, 4, 8, limit}
    size = 16
    while size < limit:
        sizes.update((size, size * 3 // 2))
        size *= 2
    return sorted(s for s in sizes if s <= limit)


def _bucket(n: int, buckets: Sequence[int]) -> int:
    for size in buckets:
        if size >= n:
            return size
    return buckets[-1]


@dataclass(eq=False)
class _Request:
    rid: int
    prompt: list[int]
    budget: int
    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    slot: int | None = None
    launched: int = 0  # tokens whose computation has been enqueued (while in a slot: see `base`)
    base: int = 0  # while in a slot: launched == the engine's decode launches - base
    aborted: bool = False
    finish: FinishReason | None = None
    result: GenerationResult | None = None
    plain: bool = field(init=False, default=True)  # plain temperature sampling: no sampler extras
    key: tuple[int, ...] = field(init=False, default=())  # the prompt, hashable (prefix sharing)

    def __post_init__(self) -> None:
        self.key = tuple(self.prompt)
        p = self.params
        sampled = p.temperature > 0
        self.plain = p.min_new_tokens <= 0 and not (sampled and (p.top_k > 0 or p.top_p < 1.0))


@dataclass(eq=False)
class _Pending:
    """A launched prefill or decode step whose tokens the host has not read yet."""

    reqs: list[_Request | None]  # per batch row: whose token it is (None: a row nobody reads)
    tokens: torch.Tensor  # a reused host buffer: its first len(reqs) entries are this step's
    log_probs: torch.Tensor
    event: Any = None
    # rows that may end beyond a stop id (a budget's last token, stop strings); None: check every row
    special: list[int] | None = None
    # per row, the lists its token and log-prob are appended to (a decode step's: its requests' lists as
    # the launch found them, a sink for free rows; a request that ended since gets them after its result
    # was copied out, harmlessly); None: append one by one
    lists: tuple[list[list[int]], list[list[float]]] | None = None


_PLAIN = SamplerMode()
_consume = deque(maxlen=0).extend  # runs an iterator to its end (the appends of `map(list.append, ...)`)
_DEPTH_ENV = "RELAX_FASTGEN_DEPTH"


def _pipeline_depth(depth: int | None, cuda: bool) -> int:
    """Decode steps left in flight after each launch: the argument, else `RELAX_FASTGEN_DEPTH`, else 2 on
    CUDA (the host may fall a step behind without the device waiting) and 1 on CPU (decode runs eagerly)."""
    if depth is None:
        env = os.environ.get(_DEPTH_ENV, "").strip()
        depth = int(env) if env else (2 if cuda else 1)
    if depth < 1:
        raise ValueError(f"pipeline_depth must be at least 1, not {depth}")
    return depth


@dataclass
class _Stats:
    prefill_seconds: float = 0.0  # measured only with timing=True (synchronised around each prefill)
    prefill_tokens: int = 0
    decode_steps: int = 0
    graph_captures: int = 0
    compactions: int = 0
    shared_prefills: int = 0  # requests whose prompt cache was copied from another's prefill
    shared_steps: int = 0  # decode steps that read a shared prefix once per group
    new_tokens: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


def _raise_recompile_limit(limit: int) -> None:
    from torch import _dynamo

    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(_dynamo.config, knob):
            setattr(_dynamo.config, knob, max(limit, getattr(_dynamo.config, knob)))


class CudaGraphs:
    """Captures functions as CUDA graphs sharing one memory pool (their temporaries are dead after each
    replay: every output a step keeps is copied into buffers allocated outside the pool)."""

    def __init__(self) -> None:
        self.pool: Any = None

    def reset(self) -> None:
        """Forget the pool (the graphs were dropped): its memory goes back with them."""
        self.pool = None

    def warm_up(self, fn: Callable[[], None]) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            fn()
        return graph.replay


@contextlib.contextmanager
def paused_collector() -> Any:
    """Python's cyclic garbage collector paused while a batch decodes (it runs once after): a decode step waits
    for the GPU's sampled tokens, so a collection during the loop stalls the GPU for its whole length, and in a
    trainer's process (megatron's and the compiler's objects) a full collection takes tens of milliseconds. The
    loop itself makes no reference cycles to speak of. `RELAX_FASTGEN_GC=1` leaves the collector running."""
    if os.environ.get("RELAX_FASTGEN_GC") == "1" or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class FastGenEngine:
    """A drop-in for `TorchRolloutEngine` (same `generate`, `load_weights`, `offload`/`onload`,
    `weight_version`, `tokenizer`, `eos_token_ids`), plus a request-level API for servers:
    `submit` / `step` / `abort` / `abort_all` / `has_unfinished`.

    Select it by constructing it where `TorchRolloutEngine(hf_checkpoint, device=...)` is built today
    (the rollout role, `runtime/roles/actors.py`, and our SGLang-protocol server,
    `runtime/rollout/sglang/server.py`): `FastGenEngine(hf_checkpoint, device=..., max_batch_size=...)`;
    or from a loaded model with `FastGenEngine.from_hf_model(model, device=...)`. The SGLang-protocol
    server runs it through `runtime/rollout/sglang/fastgen_serving.py` (`RELAX_ROLLOUT_BACKEND`). `generate` drives the scheduler itself until its own requests are done: do not mix it with
    concurrent `submit`/`step` callers (a server should use those alone).

    Knobs: `max_batch_size` (KV slots = largest decode batch), `max_seq_len` (fixed T; default: sized to
    the work), `decode_attention` ("sdpa" | "flex" | "bmm" | "sdpa_full" | "triton"; default "triton" on CUDA where
    triton is importable, else "sdpa"), `prefix_attention`
    (decode reads a prompt shared by a group of samples once per group: default on), `window_quantum`, `max_prefill_tokens`, `cuda_graphs`, `compile` (torch.compile the decode
    layers' element-wise parts and the sampler; default on CUDA, eager if the compiler fails), `eos_token_ids` (override the checkpoint's; `()` never stops on EOS), `timing`
    (synchronise around prefills so that `stats.prefill_seconds` is exact), `pipeline_depth` (decode steps
    left in flight while the host reads the oldest back: default 2 on CUDA, 1 on CPU, `RELAX_FASTGEN_DEPTH`
    when not given; 1 is the schedule of the engine before the knob; deeper, a request that ends on a stop
    id or stop string holds its slot depth - 1 steps longer, so admissions and compactions may come later,
    and a request's tokens depend on its batch only through rounding and, in batches with top-k, top-p or
    min_new_tokens, the sampler mode).

    Differences from `TorchRolloutEngine`: sampling with a given `SamplingParams.seed` is reproducible per
    request (request i of a call draws from seed `mix(seed, i)`, whatever the batch), not bit-identical to
    HF's sampler; results may end with `FinishReason.ABORT` after `abort`/`abort_all` from another thread.
    """

    def __init__(
        self,
        hf_checkpoint: str | None = None,
        *,
        device: Device,
        max_batch_size: int = 256,
        max_seq_len: int | None = None,
        dtype: torch.dtype | None = None,
        decode_attention: str | None = None,
        cuda_graphs: bool = True,
        max_prefill_tokens: int | None = None,
        window_quantum: int = 128,
        eos_token_ids: Sequence[int] | None = None,
        tokenizer: Any = None,
        timing: bool = False,
        compile: bool | None = None,
        prefix_attention: bool = True,
        pipeline_depth: int | None = None,
        _config: Mapping[str, Any] | None = None,
        _tensors: Mapping[str, torch.Tensor] | None = None,
        _generation_config: Mapping[str, Any] | None = None,
    ) -> None:
        if hf_checkpoint is not None:
            config, tensors, gen = load_hf_checkpoint(hf_checkpoint)
        elif _config is not None and _tensors is not None:
            config, tensors, gen = dict(_config), _tensors, dict(_generation_config or {})
        else:
            raise ValueError("FastGenEngine needs hf_checkpoint (or use FastGenEngine.from_hf_model)")
        self.device = device
        self.torch_device = device.torch_device
        self.cfg = ModelConfig.from_hf(config)
        cuda = device.kind is DeviceKind.CUDA
        self.dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        self.max_batch_size = max_batch_size
        self.fixed_seq_len = max_seq_len
        self.graphs: CudaGraphs | None = CudaGraphs() if cuda_graphs and cuda else None
        self.max_prefill_tokens = max_prefill_tokens or (16384 if cuda else 2048)
        self.window_quantum = window_quantum
        self.timing = timing
        self.prefix_attention = prefix_attention
        self.pipeline_depth = _pipeline_depth(pipeline_depth, cuda)
        self.weights = FlatWeights(self.cfg, self.torch_device, self.dtype)
        self.weights.check(tensors, complete=True)
        self.weights.copy_in(tensors)
        if compile is None:  # compiled by default on CUDA (eager fallback if the compiler fails)
            compile = cuda
        if decode_attention is None:
            decode_attention = (
                "triton"
                if cuda
                and triton_attention.available(self.torch_device)
                and triton_attention.supports(self.cfg.head_dim)
                else DEFAULT_DECODE_ATTENTION
            )
        self.decoder = Decoder(self.cfg, self.weights, decode_attention, compile=compile)
        self._sample = maybe_compile(sample, compile)  # decode steps only (prefill shapes vary)
        # the plain mode's full-vocabulary pass as one Triton kernel (CUDA), the rest compiled
        stats = triton_sampler.available(self.torch_device) and triton_sampler.supports(self.cfg.vocab_size)
        self._block_stats = triton_sampler.block_stats if stats else None
        self._sample_stats = maybe_compile(triton_sampler.sample_from_block_stats, compile)
        if compile or decode_attention == "flex":  # one compilation per decode batch bucket, window, mode
            _raise_recompile_limit(256)
        if eos_token_ids is None:
            eos = gen.get("eos_token_id")
            eos_token_ids = (
                (eos if isinstance(eos, list) else [eos]) if eos is not None else self.cfg.eos_token_ids
            )
        self.eos_token_ids: tuple[int, ...] = tuple(int(t) for t in eos_token_ids)
        self.stop_width = max(8, len(self.eos_token_ids) + 6)  # stop ids per request, EOS included
        self._tokenizer = tokenizer
        self._tokenizer_path = hf_checkpoint
        self.weight_version = 0
        self.offloaded = False
        self.stats = _Stats()

        self._next_rid = 0
        self._lock = threading.Lock()
        self._abort_ids: set[int] = set()
        self._abort_below = 0  # abort_all: every request submitted before it was called
        self._aborts_applied = 0  # the abort_all boundary the scheduler has applied
        self._waiting: deque[_Request] = deque()
        self._requests: dict[int, _Request] = {}
        self._done: list[_Request] = []
        self._inflight: deque[_Pending] = deque()
        self._slots: list[_Request | None] = []
        # per slot: its request's `tokens` and `log_probs` lists (free slots: the sinks, emptied as read)
        self._sink_tokens: list[int] = []
        self._sink_log_probs: list[float] = []
        self._slot_tokens: list[list[int]] = []
        self._slot_log_probs: list[list[float]] = []
        self._released: list[int] = []
        # incremental bookkeeping (see "Host work per step" above)
        self._launches = 0  # decode steps launched since the engine was built
        self._running = 0  # busy slots
        self._top = 0  # the highest busy slot + 1
        self._expiry: dict[int, list[_Request]] = {}  # launch count -> requests whose budget it completes
        self._nonplain: set[_Request] = set()  # requests in a slot that need the sampler's extras
        self._stop_live: set[_Request] = set()  # admitted, unfinished requests with stop strings
        self._aborting: set[_Request] = set()  # aborted requests waiting for their tokens in flight
        self._stop_union: frozenset[int] = frozenset()  # every unfinished request's stop ids (or more)
        self._shared_cache: tuple[int, tuple[int, int] | None] | None = None  # (batch, _shared_prefix)
        # len(prompt) - base of each busy slot's request -> how many: a row's cached tokens are that + launches - 1
        self._offsets: dict[int, int] = {}
        self._buffers: list[tuple[torch.Tensor, torch.Tensor, Any]] = []  # host buffers (+ event) to reuse
        self._pieces: dict[int, str] = {}
        self._graphs: dict[tuple[int, int, SamplerMode, tuple[int, int] | None], Callable[[], None]] = {}
        self.kv: torch.Tensor | None = None
        self.slots = 0
        self.seq_len = 0
        # a server sets this to max_batch_size: the first allocation then has a slot for every request
        # that may arrive while others run (sized to the waiting work alone, a lone first request would
        # leave no free slot and later arrivals would wait for it to end)
        self.min_slots = 0
        # ... but only as many of those reserved slots as fit this many bytes of cache (None: no cap; the
        # slots the waiting requests need are always allocated)
        self.max_cache_bytes: int | None = None

    @classmethod
    def from_hf_model(
        cls, model: Any, *, device: Device, tokenizer: Any = None, **kwargs: Any
    ) -> FastGenEngine:
        """Copy the weights of a transformers causal LM instance (its config and generation config too)."""
        gen = model.generation_config.to_dict() if getattr(model, "generation_config", None) else {}
        return cls(
            None,
            device=device,
            tokenizer=tokenizer,
            _config=model.config.to_dict(),
            _tensors=model.state_dict(),
            _generation_config=gen,
            **kwargs,
        )

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer (loaded on first use: only stop strings need it)."""
        if self._tokenizer is None:
            if self._tokenizer_path is None:
                raise RuntimeError("stop strings need a tokenizer: pass tokenizer= to FastGenEngine")
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_path)
        return self._tokenizer

    # -- weights and memory ---------------------------------------------------------------------------
    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy a full HF-named state dict into the existing parameters (no reallocation, so captured
        graphs stay valid). Refuses, before copying anything, a version other than the next one, an
        unknown or missing name, or a shape mismatch, naming the tensor. A tied `lm_head.weight` is
        accepted and ignored."""
        self._check_version(version)
        self.weights.check(named_tensors, complete=True)
        self.weights.copy_in(named_tensors)
        self._synchronize()
        self.weight_version = version

    def start_weight_update(self, version: int) -> None:
        """Bucketed updates (`--update-weight-buffer-size`): start, then `load_weight_bucket` for each
        bucket, then `finish_weight_update`, which checks that every tensor came and only then takes
        the version. Each bucket is checked (names, shapes, no repeats) before it is copied."""
        self._check_version(version)
        self._update: tuple[int, set[str]] | None = (version, set())

    def load_weight_bucket(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        update = getattr(self, "_update", None)
        if update is None:
            raise RuntimeError("load_weight_bucket without start_weight_update(version)")
        self.weights.check(named_tensors, complete=False)
        repeated = sorted(set(named_tensors) & update[1])
        if repeated:
            raise ValueError(f"weight update {update[0]}: {repeated[:3]} sent twice")
        self.weights.copy_in(named_tensors)
        self._synchronize()
        update[1].update(named_tensors)

    def finish_weight_update(self) -> None:
        update = getattr(self, "_update", None)
        if update is None:
            raise RuntimeError("finish_weight_update without start_weight_update(version)")
        self._update = None
        version, seen = update
        missing = sorted(set(self.weights.hf) - seen)
        if missing:
            more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
            raise KeyError(
                f"weight update {version} is missing {missing[:3]}{more}; still at {self.weight_version}"
            )
        self.weight_version = version

    def _check_version(self, version: int) -> None:
        expected = self.weight_version + 1
        if version != expected:
            raise ValueError(
                f"weight update version {version}: this engine holds {self.weight_version}, expected {expected}"
            )
        if self.offloaded:
            raise RuntimeError("weight update while offloaded: call onload() first")

    def _synchronize(self) -> None:
        if self.torch_device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # the sources may be freed right after we return

    def offload(self) -> None:
        """Release the device memory of the weights (kept in pinned host memory), the KV cache and the
        graphs. Refused while requests are in flight."""
        if self._requests:
            raise RuntimeError(f"offload with {len(self._requests)} requests in flight; abort them first")
        self._drop_cache()
        self.weights.offload()
        self.device.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        self.weights.onload()
        self.offloaded = False

    def release_cache(self) -> None:
        """Free the KV cache and the captured graphs (reallocated by the next request). Refused while
        requests are in flight."""
        if self._requests:
            raise RuntimeError(f"release_cache with {len(self._requests)} requests in flight")
        self._drop_cache()
        self.device.empty_cache()

    def cache_bytes(self) -> int:
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()

    @torch.no_grad()
    def forward_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits [P, V] (float32, on the engine's device) of every position of one sequence, from a scratch cache of
        its own: row j predicts token j + 1. For prompt log-probs and top-k log-probs; call it from the
        thread that calls `step`, between steps. Growing the rotary tables drops the captured graphs (they
        read the old tables), after the device has finished the step in flight."""
        if self.offloaded:
            raise RuntimeError("rollout engine is offloaded; call onload() first")
        cfg, dev = self.cfg, self.torch_device
        length = len(token_ids)
        rope = self.decoder.cos
        if rope is None or rope.shape[0] < length + 1:
            if self._graphs:
                self._synchronize()
                self._graphs.clear()
                if self.graphs is not None:
                    self.graphs.reset()
            self.decoder.ensure_rope(max(length + 1, self.seq_len + 1), dev)
        kv = torch.zeros(
            (cfg.num_layers, 2, 1, cfg.num_kv_heads, length, cfg.head_dim), dtype=self.dtype, device=dev
        )
        tokens = torch.tensor([list(token_ids)], dtype=torch.int64, device=dev)
        slot = torch.zeros(1, dtype=torch.int64, device=dev)
        chunk = self.max_prefill_tokens
        hidden = torch.cat(
            [
                self.decoder.prefill(kv, tokens[:, begin : begin + chunk], slot, start=begin)[0]
                for begin in range(0, length, chunk)
            ]
        )
        return self.decoder.logits(hidden).float()

    def _drop_cache(self) -> None:
        self._graphs.clear()
        if self.graphs is not None:
            self.graphs.reset()
        self.kv = None
        self.slots = self.seq_len = 0
        self._slots, self._released = [], []
        self._slot_tokens, self._slot_log_probs = [], []
        self._reset_slot_bookkeeping()

    def _reset_slot_bookkeeping(self) -> None:
        """No slot is busy (a new or dropped cache): what is kept per busy slot starts over."""
        self._running = self._top = 0
        self._expiry.clear()
        self._nonplain.clear()
        self._shared_cache = None
        self._offsets.clear()
        self._buffers = []

    # -- the request-level API --------------------------------------------------------------------------
    def submit(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        budget: int | None = None,
        seed: int | None = None,
    ) -> int:
        """Queue one request; returns its id. `budget` caps its new tokens below `params.max_new_tokens`;
        `seed` overrides `params.seed` (None: a seed drawn from torch's global generator)."""
        if not prompt:
            raise ValueError("empty prompt: fastgen needs at least one token to continue")
        budget = params.max_new_tokens if budget is None else max(0, min(budget, params.max_new_tokens))
        if self.fixed_seq_len is not None:
            if len(prompt) >= self.fixed_seq_len:
                raise ValueError(
                    f"prompt of {len(prompt)} tokens does not fit max_seq_len={self.fixed_seq_len}"
                )
            budget = min(budget, self.fixed_seq_len - len(prompt) + 1)
        if seed is None:
            seed = params.seed if params.seed is not None else int(torch.randint(0, 2**31 - 1, ()).item())
        stop_ids = frozenset(self.eos_token_ids) | frozenset(params.stop_token_ids)
        if len(stop_ids) > self.stop_width:
            raise ValueError(
                f"{len(stop_ids)} stop token ids (EOS included); fastgen allows {self.stop_width}"
            )
        with self._lock:
            req = _Request(self._next_rid, list(prompt), budget, params, mix_seed(seed), stop_ids)
            self._next_rid += 1
            if not self._requests:  # nothing unfinished: the union starts over
                self._stop_union = frozenset()
            if not stop_ids <= self._stop_union:  # a new set, never mutated: readers need no lock
                self._stop_union = self._stop_union | stop_ids
            self._requests[req.rid] = req
            if budget == 0:
                self._finish(req, FinishReason.LENGTH)
            else:
                self._waiting.append(req)
        return req.rid

    def abort(self, rid: int) -> None:
        """Ask for request `rid` to end with FinishReason.ABORT and what it generated so far (thread-safe)."""
        with self._lock:
            self._abort_ids.add(rid)

    def abort_all(self) -> None:
        """Abort every request submitted so far (thread-safe; later ones are not affected)."""
        with self._lock:
            self._abort_below = self._next_rid

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def step(self) -> list[tuple[int, GenerationResult]]:
        """One scheduler iteration; returns the requests that finished during it."""
        if torch.is_grad_enabled():  # (`generate` runs it under no_grad already: entering it costs µs)
            with torch.no_grad():
                return self._step()
        return self._step()

    def _step(self) -> list[tuple[int, GenerationResult]]:
        if self.offloaded:
            raise RuntimeError("rollout engine is offloaded; call onload() first")
        self._apply_aborts()
        self._admit()
        launched = self._launch_decode()
        self._drain(keep=self.pipeline_depth if launched else 0)
        done, self._done = self._done, []
        return [(req.rid, req.result) for req in done if req.result is not None]

    # -- the TorchRolloutEngine surface ---------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int] | None = None
    ) -> list[GenerationResult]:
        """Continue every token sequence in `prompts` (as `TorchRolloutEngine.generate`)."""
        if self.offloaded:
            raise RuntimeError("rollout engine is offloaded; call onload() first")
        start = time.perf_counter()
        self.stats = _Stats()
        budgets = budgets if budgets is not None else [params.max_new_tokens] * len(prompts)
        base = params.seed if params.seed is not None else int(torch.randint(0, 2**31 - 1, ()).item())
        rids = [
            self.submit(prompt, params, budget=budget, seed=mix_seed(base, i))
            for i, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True))
        ]
        results: dict[int, GenerationResult] = {}
        with paused_collector():
            while len(results) < len(rids):
                for rid, result in self.step():
                    results[rid] = result
        self.stats.seconds = time.perf_counter() - start
        self.stats.new_tokens = sum(len(r.token_ids) for r in results.values())
        return [results[rid] for rid in rids]

    # -- scheduling ---------------------------------------------------------------------------------------
    def _apply_aborts(self) -> None:
        with self._lock:
            if not self._abort_ids and self._abort_below <= self._aborts_applied:
                return
            ids, self._abort_ids = self._abort_ids, set()
            below = self._abort_below
            if below > self._aborts_applied:  # once: later requests have higher ids
                ids |= {rid for rid in self._requests if rid < below}
                self._aborts_applied = below
        for rid in ids:
            req = self._requests.get(rid)
            if req is None or req.finish is not None:
                continue
            req.aborted = True
            if req.slot is None and req.launched == 0:
                self._waiting.remove(req)
                self._finish(req, FinishReason.ABORT)
                continue
            self._release(req)
            if len(req.tokens) >= req.launched:
                self._finish(req, FinishReason.ABORT)
            else:  # ends when its tokens in flight are read (`_process`)
                self._aborting.add(req)

    def _need(self, req: _Request) -> int:
        return len(req.prompt) + req.budget - 1  # positions written: up to prompt + budget - 2

    def _ensure_capacity(self) -> None:
        """(Re)allocate the cache for the waiting work when idle and it does not fit."""
        if not self._waiting or self._running or self._inflight:
            return
        need_len = max(self._need(r) for r in self._waiting)
        q = self.window_quantum
        seq_len = self.fixed_seq_len or max(self.seq_len, math.ceil(need_len / q) * q)
        buckets = batch_buckets(self.max_batch_size)
        wanted = min(self.max_batch_size, len(self._waiting))
        reserve = min(self.max_batch_size, self.min_slots)
        if self.max_cache_bytes is not None and reserve > wanted:  # the reserve only as far as it fits
            fit = self.max_cache_bytes // self._slot_bytes(seq_len)
            reserve = max((b for b in buckets if b <= min(fit, reserve)), default=1)
        need_slots = max(wanted, reserve)
        if (
            self.kv is not None
            and need_len <= self.seq_len
            and (need_slots <= self.slots or self.slots == self.max_batch_size)
        ):
            return
        slots = _bucket(need_slots, buckets)
        if self.max_cache_bytes is None:
            slots = max(self.slots, slots)
        self._allocate(slots, seq_len)

    def _slot_bytes(self, seq_len: int) -> int:
        cfg = self.cfg
        return cfg.num_layers * 2 * cfg.num_kv_heads * seq_len * cfg.head_dim * self.dtype.itemsize

    def _allocate(self, slots: int, seq_len: int) -> None:
        cfg = self.cfg
        self._drop_cache()
        self.device.empty_cache()
        dev = self.torch_device
        shape = (cfg.num_layers, 2, slots, cfg.num_kv_heads, seq_len, cfg.head_dim)
        self.kv = torch.zeros(shape, dtype=self.dtype, device=dev)  # zeros: masked positions must be finite
        self.slots, self.seq_len = slots, seq_len
        self.decoder.ensure_rope(seq_len + 1, dev)
        self.cur_tok = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.lengths = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.active = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.state = SlotState.allocate(slots, self.stop_width, dev)
        self.out_tok = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.out_logp = torch.zeros(slots, dtype=torch.float32, device=dev)
        self._slots = [None] * slots
        self._slot_tokens = [self._sink_tokens] * slots
        self._slot_log_probs = [self._sink_log_probs] * slots
        self.buckets = batch_buckets(slots)

    def _free_slots(self) -> list[int]:
        return [i for i, r in enumerate(self._slots) if r is None]

    def _admit(self) -> None:
        if not self._waiting:
            return
        self._ensure_capacity()
        if self.kv is None or self._running >= self.slots:
            return
        self._flush_releases()  # before a released slot is filled again
        free = self._free_slots()
        while self._waiting and free:
            group: list[_Request] = []
            distinct: set[tuple[int, ...]] = set()  # a prompt already in the group is prefilled once
            width = 0
            for req in self._waiting:
                if len(group) == len(free) or self._need(req) > self.seq_len:
                    break
                key = req.key
                if key not in distinct:
                    new_width = max(width, len(req.prompt))
                    if group and new_width * (len(distinct) + 1) > self.max_prefill_tokens:
                        break
                    distinct.add(key)
                    width = new_width
                group.append(req)
            if not group:
                return  # the head needs a larger cache: admitted once the engine is idle
            for _ in group:
                self._waiting.popleft()
            self._prefill(group, free[: len(group)])
            free = free[len(group) :]

    def _sampler_mode(self, reqs: Iterable[_Request], *, running: bool = False) -> SamplerMode:
        """`running`: the requests hold slots (their launched count is the launch counter's)."""
        reqs = [r for r in reqs if not r.plain]
        if not reqs:
            return _PLAIN
        launches = self._launches
        top_k = max((r.params.top_k for r in reqs if r.params.temperature > 0), default=0)
        k_bucket = 0 if top_k <= 0 else min(1 << (top_k - 1).bit_length(), self.cfg.vocab_size)
        return SamplerMode(
            top_k=k_bucket,
            top_p=any(r.params.top_p < 1.0 and r.params.temperature > 0 for r in reqs),
            suppress=any(
                (launches - r.base if running else r.launched) < r.params.min_new_tokens for r in reqs
            ),
        )

    def _set_slot_state(self, group: list[_Request], slot_idx: torch.Tensor) -> None:
        stops = torch.full((len(group), self.stop_width), -1, dtype=torch.int64)
        for row, req in enumerate(group):
            ids = sorted(req.stop_ids)
            stops[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        host = {
            "temperature": torch.tensor([max(0.0, r.params.temperature) for r in group], dtype=torch.float32),
            "top_k": torch.tensor([max(0, r.params.top_k) for r in group], dtype=torch.int64),
            "top_p": torch.tensor([r.params.top_p for r in group], dtype=torch.float32),
            "seed": torch.tensor([r.seed for r in group], dtype=torch.int64),
            "generated": torch.zeros(len(group), dtype=torch.int64),
            "min_new": torch.tensor([r.params.min_new_tokens for r in group], dtype=torch.int64),
            "stop_ids": stops,
        }
        for name, tensor in host.items():
            getattr(self.state, name)[slot_idx] = tensor.to(self.torch_device, non_blocking=True)

    def _prefill(self, group: list[_Request], slots: list[int]) -> None:
        if self.timing and self.torch_device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        dev = self.torch_device
        slot_idx = self._ints(slots)
        self._set_slot_state(group, slot_idx)
        # Prefix sharing (GRPO's n samples of one prompt): each distinct prompt is prefilled once, into
        # the slot of its first request; the others get a copy of that slot's cache rows.
        first: dict[tuple[int, ...], int] = {}
        owner: list[int] = []  # row -> index of its distinct prompt
        unique: list[_Request] = []
        unique_slots: list[int] = []
        for req, slot in zip(group, slots, strict=True):
            if req.key not in first:
                first[req.key] = len(unique)
                unique.append(req)
                unique_slots.append(slot)
            owner.append(first[req.key])
            req.key = unique[
                owner[-1]
            ].key  # one object per prompt: `_shared_prefix` compares by identity first
        lens = [len(r.prompt) for r in unique]
        width = max(lens)
        unique_idx = self._ints(unique_slots)
        tokens = torch.zeros(len(unique), width, dtype=torch.int64)
        for row, req in enumerate(unique):
            tokens[row, : lens[row]] = torch.tensor(req.prompt, dtype=torch.int64)
        tokens = tokens.to(dev, non_blocking=True)
        assert self.kv is not None
        if width <= self.max_prefill_tokens:
            hidden = self.decoder.prefill(self.kv, tokens, unique_idx)
        else:  # one long prompt (alone in its group), in chunks that attend to the cached prefix
            chunk = self.max_prefill_tokens
            for begin in range(0, width, chunk):
                hidden = self.decoder.prefill(
                    self.kv, tokens[:, begin : begin + chunk], unique_idx, start=begin
                )
            lens = [width - (width - 1) // chunk * chunk]
        copies = [(unique_slots[o], s) for o, s in zip(owner, slots, strict=True) if s != unique_slots[o]]
        if copies:
            src = self._ints([a for a, _ in copies])
            dst = self._ints([b for _, b in copies])
            self.kv[:, :, dst, :, :width] = self.kv[:, :, src, :, :width]
            self.stats.shared_prefills += len(copies)
        last = self._ints([n - 1 for n in lens])
        logits = self.decoder.logits(hidden[torch.arange(len(unique), device=dev), last])
        if copies:
            logits = logits[self._ints(owner)]
        token, log_prob = sample(logits, self.state, self._sampler_mode(group), slot_idx)
        self.cur_tok[slot_idx] = token
        self.lengths[slot_idx] = self._ints([len(r.prompt) for r in group])
        self.active[slot_idx] = 1
        self.state.generated[slot_idx] = 1
        start = self._launches - 1  # launched == 1 now, + 1 for each decode launch while in its slot
        for req, slot in zip(group, slots, strict=True):
            req.slot = slot
            req.launched = 1
            req.base = start
            self._slots[slot] = req
            self._slot_tokens[slot], self._slot_log_probs[slot] = req.tokens, req.log_probs
            self._expiry.setdefault(start + req.budget, []).append(req)
            offset = len(req.prompt) - start
            self._offsets[offset] = self._offsets.get(offset, 0) + 1
            if not req.plain:
                self._nonplain.add(req)
            if req.params.stop:
                self._stop_live.add(req)
        self._running += len(group)
        self._top = max(self._top, max(slots) + 1)
        self._shared_cache = None
        self._enqueue(list(group), token, log_prob, None)
        self.stats.prefill_tokens += sum(len(r.prompt) for r in unique)
        if self.timing and self.torch_device.type == "cuda":
            torch.cuda.synchronize()
        self.stats.prefill_seconds += time.perf_counter() - started

    def _enqueue(
        self,
        reqs: list[_Request | None],
        token: torch.Tensor,
        log_prob: torch.Tensor,
        special: list[int] | None,
        lists: tuple[list[list[int]], list[list[float]]] | None = None,
    ) -> None:
        """Copy a step's tokens and log-probs into host buffers (reused once read; pinned, with an event
        recorded after the copies, on CUDA) and queue them for `_process`."""
        if self._buffers:
            host_tok, host_lp, event = self._buffers.pop()
        else:
            cuda = self.torch_device.type == "cuda"
            host_tok = torch.empty(self.slots, dtype=torch.int64, pin_memory=cuda)
            host_lp = torch.empty(self.slots, dtype=torch.float32, pin_memory=cuda)
            event = torch.cuda.Event() if cuda else None
        n = len(reqs)
        host_tok[:n].copy_(token, non_blocking=True)
        host_lp[:n].copy_(log_prob, non_blocking=True)
        if event is not None:
            event.record()
        self._inflight.append(_Pending(reqs, host_tok, host_lp, event, special, lists))

    def _ints(self, values: list[int]) -> torch.Tensor:
        """Host ints as an int64 tensor on the device, without waiting for it: on CUDA through pinned memory
        and an asynchronous copy (`torch.tensor(..., device=cuda)` synchronises the stream, so a release or
        an admission would drain the decode steps in flight and leave the device idle meanwhile)."""
        if self.torch_device.type == "cuda":
            host = torch.tensor(values, dtype=torch.int64, pin_memory=True)
            return host.to(self.torch_device, non_blocking=True)
        return torch.tensor(values, dtype=torch.int64, device=self.torch_device)

    def _release(self, req: _Request) -> None:
        slot = req.slot
        if slot is None:
            return
        req.launched = self._launches - req.base
        req.slot = None
        self._slots[slot] = None
        self._slot_tokens[slot], self._slot_log_probs[slot] = self._sink_tokens, self._sink_log_probs
        self._released.append(slot)
        self._running -= 1
        if not req.plain:
            self._nonplain.discard(req)
        offset = len(req.prompt) - req.base
        if (left := self._offsets[offset] - 1) > 0:
            self._offsets[offset] = left
        else:
            del self._offsets[offset]
        if slot + 1 == self._top:
            top = slot
            while top and self._slots[top - 1] is None:
                top -= 1
            self._top = top
        self._shared_cache = None

    def _flush_releases(self) -> None:
        if not self._released:
            return
        idx = self._ints(self._released)
        for tensor in (self.active, self.lengths, self.state.generated):
            tensor.index_fill_(0, idx, 0)  # (cheaper on the host than `tensor[idx] = 0`)
        self._released = []

    def _compact(self) -> None:
        """Move the highest busy slots down so that the decode batch is the bucket of the running count."""
        if not self._running:
            return
        target = _bucket(self._running, self.buckets)
        if _bucket(self._top, self.buckets) <= target:
            return
        busy = [i for i, r in enumerate(self._slots) if r is not None]
        free = [i for i in range(target) if self._slots[i] is None]
        src = [i for i in busy if i >= target]
        dst = free[: len(src)]
        assert len(dst) == len(src)
        assert self.kv is not None
        s, d = self._ints(src), self._ints(dst)
        self.kv[:, :, d] = self.kv[:, :, s]
        for tensor in (self.cur_tok, self.lengths, self.active, *self.state.fields().values()):
            tensor[d] = tensor[s]
        for a, b in zip(src, dst, strict=True):
            req = self._slots[a]
            assert req is not None
            self._slots[b], self._slots[a] = req, None
            self._slot_tokens[b], self._slot_tokens[a] = req.tokens, self._sink_tokens
            self._slot_log_probs[b], self._slot_log_probs[a] = req.log_probs, self._sink_log_probs
            req.slot = b
        top = self._top
        while top and self._slots[top - 1] is None:
            top -= 1
        self._top = top
        self._shared_cache = None
        self._released.extend(src)
        self._flush_releases()
        self.stats.compactions += 1

    def _launch_decode(self) -> bool:
        ended = self._expiry.pop(self._launches, None)
        if ended:  # their budget's last token is already on its way
            for req in ended:
                self._release(req)
        self._flush_releases()
        self._compact()
        if not self._running:
            return False
        batch = _bucket(self._top, self.buckets)
        shared = self._shared(batch) if self.prefix_attention else None
        attention = self.decoder.decode_attention
        if attention == "triton" or (shared is None and attention == "sdpa_full"):
            window = self.seq_len  # triton reads each row to its own length: no window
        else:
            longest = self._launches + max(self._offsets)  # the longest row's cached tokens + 1
            if shared is not None:
                rest = math.ceil((longest - shared[1]) / self.window_quantum) * self.window_quantum
                window = min(self.seq_len - shared[1], rest)
            else:
                window = min(self.seq_len, math.ceil(longest / self.window_quantum) * self.window_quantum)
        mode = self._sampler_mode(self._nonplain, running=True) if self._nonplain else _PLAIN
        self._run_decode(batch, window, mode, shared)
        self.stats.shared_steps += shared is not None
        self._launches += 1  # every busy slot is in the batch: one more token launched for each
        ending = self._expiry.get(self._launches)
        special = [r.slot for r in ending if r.slot is not None] if ending else []
        if self._stop_live:
            special.extend(r.slot for r in self._stop_live if r.slot is not None)
        lists = (self._slot_tokens[:batch], self._slot_log_probs[:batch])
        self._enqueue(self._slots[:batch], self.out_tok[:batch], self.out_logp[:batch], special, lists)
        self.stats.decode_steps += 1
        return True

    def _shared(self, batch: int) -> tuple[int, int] | None:
        """`_shared_prefix(batch)`, cached until the slot assignment changes (admission, release, compaction)."""
        cached = self._shared_cache
        if cached is None or cached[0] != batch:
            cached = self._shared_cache = (batch, self._shared_prefix(batch))
        return cached[1]

    def _shared_prefix(self, batch: int) -> tuple[int, int] | None:
        """(n, P) when decode rows 0..batch-1 come in groups of n consecutive slots that hold copies of
        one prefill (n samples of a prompt admitted together): each group's first slot is busy, its
        other slots are free or hold the same prompt, and P (the shortest such prompt, rounded down to
        `window_quantum`) positions are shared. None otherwise (decode attends per row)."""
        slots = self._slots[:batch]
        head = slots[0]
        if head is None:
            return None
        key = head.key
        n = 1  # (keys: one object per prompt admitted together, so `is` settles most comparisons)
        while n < batch and (other := slots[n]) is not None and (other.key is key or other.key == key):
            n += 1
        if n < 2 or batch % n:
            return None
        shortest = self.seq_len
        for start in range(0, batch, n):
            holder = slots[start]
            members = slots[start + 1 : start + n]
            if holder is None:
                if any(m is not None for m in members):
                    return None
                continue
            key = holder.key
            for m in members:
                if m is not None and m.key is not key and m.key != key:
                    return None
            shortest = min(shortest, len(holder.prompt))
        prefix = shortest // self.window_quantum * self.window_quantum
        return (n, prefix) if prefix > 0 else None

    def _decode_body(
        self, batch: int, window: int, mode: SamplerMode, shared: tuple[int, int] | None = None
    ) -> None:
        assert self.kv is not None
        logits = self.decoder.decode(self.kv, self.cur_tok[:batch], self.lengths[:batch], window, shared)
        if self._block_stats is not None and mode == _PLAIN:
            stats = self._block_stats(logits, self.state.temperature[:batch])
            token, log_prob = self._sample_stats(logits, *stats, self.state, slice(0, batch))
        else:
            token, log_prob = self._sample(logits, self.state, mode, slice(0, batch))
        self.out_tok[:batch].copy_(token)
        self.out_logp[:batch].copy_(log_prob)
        self.cur_tok[:batch].copy_(token)
        self.lengths[:batch] += self.active[:batch]
        self.state.generated[:batch] += self.active[:batch]

    def _run_decode(
        self, batch: int, window: int, mode: SamplerMode, shared: tuple[int, int] | None = None
    ) -> None:
        if self.graphs is None:
            self._decode_body(batch, window, mode, shared)
            return
        key = (batch, window, mode, shared)
        replay = self._graphs.get(key)
        if replay is None:
            replay = self._capture(batch, window, mode, shared)
            self._graphs[key] = replay
        replay()

    def _capture(
        self, batch: int, window: int, mode: SamplerMode, shared: tuple[int, int] | None = None
    ) -> Callable[[], None]:
        """Capture one decode step. The warm-up run mutates the step's state; it is put back after."""
        assert self.graphs is not None
        mutable = (self.cur_tok, self.lengths, self.state.generated, self.out_tok, self.out_logp)
        saved = [t.clone() for t in mutable]
        body = functools.partial(self._decode_body, batch, window, mode, shared)
        self.graphs.warm_up(body)
        for tensor, copy in zip(mutable, saved, strict=True):
            tensor.copy_(copy)
        replay = self.graphs.capture(body)
        self.stats.graph_captures += 1
        return replay

    # -- reading results back -------------------------------------------------------------------------
    def _drain(self, keep: int) -> None:
        while len(self._inflight) > keep:
            self._process(self._inflight.popleft())

    def _process(self, pending: _Pending) -> None:
        """Append each row's token to its request (rows of finished requests: dropped) and end those that
        ended. Only rows that may end are checked: a token among the stop ids of some request, the rows of
        `pending.special` (a budget's last token, stop strings); every row while an abort drains."""
        if pending.event is not None:
            pending.event.synchronize()
        reqs = pending.reqs
        n = len(reqs)
        tokens = pending.tokens[:n].tolist()
        log_probs = pending.log_probs[:n].tolist()
        if pending.tokens.shape[0] == self.slots:  # (not a buffer of a cache dropped since)
            self._buffers.append((pending.tokens, pending.log_probs, pending.event))
        special, lists = pending.special, pending.lists
        if special is None or lists is None or self._aborting:
            for row, req in enumerate(reqs):
                if req is None or req.finish is not None:
                    continue
                token = tokens[row]
                req.tokens.append(token)
                req.log_probs.append(log_probs[row])
                self._check_end(req, token)
            return
        _consume(map(list.append, lists[0], tokens))  # every row's token to its list, at C speed
        _consume(map(list.append, lists[1], log_probs))
        self._sink_tokens.clear()
        self._sink_log_probs.clear()
        stops = self._stop_union
        if stops and not stops.isdisjoint(tokens):
            special = special + [row for row, token in enumerate(tokens) if token in stops]
        if special:
            for row in sorted(set(special)):  # in row order, as a pass over every row ends them
                req = reqs[row]
                if req is not None and req.finish is None:
                    self._check_end(req, tokens[row])

    def _check_end(self, req: _Request, token: int) -> None:
        """`token`, just appended, may end `req`."""
        if token in req.stop_ids:
            self._finish(req, FinishReason.STOP)
        elif req.params.stop and self._stop_string_hit(req, token):
            self._finish(req, FinishReason.STOP)
        elif len(req.tokens) >= req.budget:
            self._finish(req, FinishReason.LENGTH)
        elif req.aborted and len(req.tokens) >= req.launched:
            self._finish(req, FinishReason.ABORT)

    def _piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self.tokenizer.decode([token])
        return piece

    def _stop_string_hit(self, req: _Request, token: int) -> bool:
        """Cheap first: a stop string can only newly appear when this token's text holds its last
        character (or bytes of a character still being spelled); then the text of the last few tokens."""
        stops = req.params.stop
        piece = self._piece(token)
        if "\ufffd" not in piece and not any(stop[-1] in piece for stop in stops if stop):
            return False
        tail = self.tokenizer.decode(req.tokens[-4 * max(len(s) for s in stops) - 1 :])
        return any(stop in tail for stop in stops)

    def _finish(self, req: _Request, reason: FinishReason) -> None:
        self._release(req)
        self._stop_live.discard(req)
        self._aborting.discard(req)
        if req.params.stop:  # the response ends after the first stop string (the shortest such prefix)
            from runtime.rollout.engine import stop_string_end  # (transformers: only with stop strings)

            end = stop_string_end(self.tokenizer, req.tokens, req.params.stop)
            if end is not None:
                del req.tokens[end:], req.log_probs[end:]
                reason = FinishReason.STOP
        req.finish = reason
        req.result = GenerationResult(list(req.tokens), list(req.log_probs), reason, self.weight_version)
        self._requests.pop(req.rid, None)
        self._done.append(req)
