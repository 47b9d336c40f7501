"""The built-in torch engine behind the SGLang-compatible server: batches concurrent requests, generates
with SGLang's stop and log-prob semantics, and owns weight updates, memory release and aborts.

One worker thread runs the model; HTTP handlers only enqueue and wait. Requests waiting together are
grouped by their batch-level sampling parameters and each group runs as one HF `generate` over
`TorchRolloutEngine.model`, with the same padding, config and log-prob computation as
`TorchRolloutEngine.generate`, so a group whose rows share a seed reproduces the in-process engine
token for token. What HF `generate` does not know (stop strings, aborts, min_new_tokens, ignore_eos,
SGLang's finish reasons and text trimming) is added around it here.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, StoppingCriteria, StoppingCriteriaList

from runtime.rollout.engine import TorchRolloutEngine
from runtime.rollout.sglang.protocol import (
    Finish,
    FinishType,
    GenerationOutput,
    GenerationRequest,
    ProtocolError,
    RequestSampling,
    batch_seed,
)
from runtime.rollout.sglang.tensor_payload import read_hf_weights

log = logging.getLogger(__name__)

ENGINE_NAME = "relax-torch"  # `engine` in /get_server_info: how clients tell our server from SGLang
DEFAULT_WEIGHT_VERSION = "default"  # SGLang's initial weight_version


class EngineUnavailable(RuntimeError):
    """The engine cannot generate now (its memory is released); HTTP 503."""


class MemoryTag(StrEnum):
    WEIGHTS = "weights"  # the model's parameters (moved to a CPU backup while released)
    KV_CACHE = "kv_cache"  # HF generate keeps no cache between calls: released/resumed as a state only


@dataclass
class _Job:
    request: GenerationRequest
    future: concurrent.futures.Future[GenerationOutput]
    submitted: float = field(default_factory=time.perf_counter)
    aborted: str | None = None  # the abort message once /abort_request names it; read between decode steps


def check_weight_version(current: str, new: str | None) -> None:
    """A weight update that names its version must not go back: where both versions are integers (the
    runtime sends its weight sync's version), one older than the engine's is refused before anything is
    loaded (a stale push, or pushes out of order). The same version again is accepted (the SFT loop pushes
    the current weights again before predicting); so is any version while the engine still has SGLang's
    initial `"default"`, and any non-integer label (SGLang's are free-form strings).
    `/update_weight_version` sets a version unchecked (the way to move an engine back on purpose)."""
    if new is None or current == DEFAULT_WEIGHT_VERSION:
        return
    try:
        old_number, new_number = int(current), int(new)
    except ValueError:
        return
    if new_number < old_number:
        raise ProtocolError(
            f"weight_version {new!r} is older than this engine's {current!r}: update refused, weights "
            "unchanged (a stale push; /update_weight_version resets the version on purpose)"
        )


def check_named_tensors(
    named: Mapping[str, torch.Tensor],
    shapes: Mapping[str, tuple[int, ...]],
    optional: AbstractSet[str] = frozenset(),
) -> None:
    """Refuse a weight update, before anything is loaded, that names a tensor the engine does not hold (in
    neither `shapes` nor `optional`: names it accepts and ignores) or sends one in another shape."""
    unknown = sorted(set(named) - set(shapes) - optional)
    if unknown:
        raise ProtocolError(f"unknown weight names: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    for name, tensor in named.items():
        if name in shapes and tuple(tensor.shape) != tuple(shapes[name]):
            raise ProtocolError(f"{name}: shape {tuple(tensor.shape)} != {tuple(shapes[name])}")


def detokenize(
    tokenizer: PreTrainedTokenizerBase | None, ids: list[int], finish: Finish, sampling: RequestSampling
) -> str | None:
    """SGLang's detokenizer: a matched stop token is cut before decoding, a matched stop string
    (and what follows it) after; `no_stop_trim` keeps both. output_ids always keep them."""
    if tokenizer is None:
        return None
    stop_token = finish.type is FinishType.STOP and isinstance(finish.matched, int)
    if stop_token and not sampling.no_stop_trim and ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=sampling.skip_special_tokens)
    if finish.type is FinishType.STOP and isinstance(finish.matched, str):
        pos = text.find(finish.matched)
        if pos != -1:
            text = text[: pos + len(finish.matched)] if sampling.no_stop_trim else text[:pos]
    return text


@dataclass
class _DistributedUpdate:
    """The buckets of one distributed weight update so far (`ServingBase._distributed_bucket`)."""

    seen: set[str] = field(default_factory=set)
    refused: str | None = None  # why a bucket was refused: the rest of the update is refused too


class ServingBase:
    """What both serving engines (`ServingEngine` here, `FastGenServing` in fastgen_serving.py) keep alike:
    the table of queued and running requests (submit's queueing, abort, flush_cache), SGLang's stop ids,
    the weight-version bookkeeping and the memory tags. Subclasses run the requests; they set the
    engine-specific fields before or after calling this `__init__`."""

    engine_name: str
    engine: Any  # the subclass's engine, which counts the weight updates it takes (`weight_version`)
    _thread: threading.Thread  # the subclass's worker, running `_serve`

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase | None, *, model_path: str, eos_token_ids: tuple[int, ...]
    ) -> None:
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.eos_token_ids = eos_token_ids
        self.weight_version = DEFAULT_WEIGHT_VERSION
        self._cond = threading.Condition()
        self._pending: list[Any] = []  # the subclass's jobs: each has `.request`, `.future` and `.aborted`
        self._jobs: dict[str, Any] = {}  # queued or running, by rid
        self._closing = False
        self._released: set[MemoryTag] = set()
        self._distributed: _DistributedUpdate | None = None  # an /update_weights_from_distributed in progress
        self._counts = {
            "requests": 0,
            "generated_tokens": 0,
            "cache_flushes": 0,
            "weight_updates": 0,
            "memory_releases": 0,  # release_memory_occupation calls that released weights
        }

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Queued requests fail with EngineUnavailable; the worker ends after its current batch or step."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # -- generation -----------------------------------------------------------------------------------------
    def _enqueue(self, jobs: list[Any]) -> list[concurrent.futures.Future[GenerationOutput]]:
        """Queue the jobs for the worker; a rid already queued or running refuses them all."""
        with self._cond:
            if self._closing:
                raise EngineUnavailable("the engine is shutting down")
            for job in jobs:
                if job.request.rid in self._jobs:
                    raise ProtocolError(f"request id {job.request.rid!r} is already running")
            for job in jobs:
                self._jobs[job.request.rid] = job
            self._pending.extend(jobs)
            self._cond.notify_all()
        return [job.future for job in jobs]

    def abort(
        self, rid: str = "", *, abort_all: bool = False, message: str = "Aborted by /abort_request"
    ) -> int:
        """Mark queued and running requests aborted: by exact rid, by the rid the caller gave before n > 1
        expanded it, or all. Running ones stop at their engine's next check (`_aborted`) and keep what
        they generated."""
        with self._cond:
            targets = [
                job
                for job in self._jobs.values()
                if abort_all or (rid and rid in (job.request.rid, job.request.logical_rid))
            ]
            for job in targets:
                job.aborted = job.aborted or message
                self._aborted(job)
        return len(targets)

    def _aborted(self, job: Any) -> None:
        """(under the condition) `job` was just marked aborted; the engine may need telling."""

    def _require_memory(self) -> None:
        if self._released:
            raise EngineUnavailable(
                f"memory is released ({', '.join(sorted(self._released))}); call /resume_memory_occupation first"
            )

    def _stop_ids(self, sampling: RequestSampling) -> tuple[int, ...]:
        # SGLang's ignore_eos skips every token-based stop (EOS and stop_token_ids alike).
        return (
            () if sampling.ignore_eos else tuple(dict.fromkeys(self.eos_token_ids + sampling.stop_token_ids))
        )

    # -- weights --------------------------------------------------------------------------------------------
    def _distributed_bucket(
        self,
        named: Mapping[str, torch.Tensor],
        weight_version: str | None,
        *,
        shapes: Mapping[str, tuple[int, ...]],
        optional: set[str],
        copy: Callable[[Mapping[str, torch.Tensor]], None],
    ) -> str:
        """One bucket of `/update_weights_from_distributed` (call under the subclass's model lock), already
        received. SGLang's callers send a push as buckets, the version with the last: the first bucket
        opens an update; each is checked (unknown names, shapes, a tensor sent twice) before it is copied;
        the bucket carrying `weight_version` closes it, refusing a tensor `shapes` names that never came
        (the version is then not taken). Once a bucket is refused, the rest of that update is refused too,
        naming the first reason, until its closing bucket."""
        check_weight_version(self.weight_version, weight_version)
        update = self._distributed if self._distributed is not None else _DistributedUpdate()
        self._distributed = None if weight_version is not None else update
        if update.refused is not None:
            raise ProtocolError(f"an earlier bucket of this weight update was refused: {update.refused}")
        try:
            check_named_tensors(named, shapes, optional)
            repeated = sorted(set(named) & update.seen)
            if repeated:
                raise ProtocolError(f"weight update sends {repeated[:3]} twice")
            copy(named)
            update.seen |= set(named)
            if weight_version is not None:
                missing = sorted(set(shapes) - update.seen)
                if missing:
                    more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
                    raise ProtocolError(
                        f"weight update to version {weight_version!r} is missing {missing[:3]}{more}; the "
                        f"version stays {self.weight_version!r} (the weights are a mix: push them all again)"
                    )
        except ProtocolError as exc:
            update.refused = str(exc)
            raise
        if weight_version is not None:
            self._finish_update(weight_version)
        return "Succeeded to update parameter online."

    def _finish_update(self, weight_version: str | None) -> None:
        if weight_version is not None:
            self.weight_version = weight_version
        self._counts["weight_updates"] += 1

    def _finish_tensor_update(self, weight_version: str | None) -> str:
        """`_finish_update` of update_weights_from_tensors, once the engine holds the tensors (the engine's
        own count of updates moves on too); SGLang's reply."""
        self.engine.weight_version += 1
        self._finish_update(weight_version)
        return "Success"

    def _finish_disk_update(self, model_path: str, weight_version: str | None) -> str:
        """`_finish_update` of update_weights_from_disk, which also moves `model_path`; SGLang's reply."""
        self.model_path = model_path
        self._finish_update(weight_version)
        return f"Succeeded to update model weights from {model_path}."

    def _require_resident(self, action: str) -> None:
        if MemoryTag.WEIGHTS in self._released:
            raise ProtocolError(f"{action}: weights are released; call /resume_memory_occupation first")

    # -- memory ---------------------------------------------------------------------------------------------
    @staticmethod
    def _tags(tags: list[str] | None) -> set[MemoryTag]:
        if not tags:
            return set(MemoryTag)
        try:
            return {MemoryTag(t) for t in tags}
        except ValueError:
            raise ProtocolError(
                f"unknown memory tags {tags}; valid: {[t.value for t in MemoryTag]}"
            ) from None

    def _released_state(self) -> dict[str, str]:
        """memory_state's `weights` and `kv_cache`: released or resident."""
        return {tag.value: "released" if tag in self._released else "resident" for tag in MemoryTag}

    def flush_cache(self) -> bool:
        """No prefix cache is kept between requests; like SGLang, refuse while requests are queued or
        running."""
        with self._cond:
            if self._jobs:
                return False
            self._counts["cache_flushes"] += 1
            return True


class ServingEngine(ServingBase):
    """Requests in, `GenerationOutput`s out; see the module docstring. The interface `server.py` calls
    (`FastGenServing` in fastgen_serving.py offers the same)."""

    engine_name = ENGINE_NAME

    def __init__(
        self,
        engine: TorchRolloutEngine,
        tokenizer: PreTrainedTokenizerBase | None,
        *,
        model_path: str,
        max_batch_size: int = 256,
    ) -> None:
        super().__init__(tokenizer, model_path=model_path, eos_token_ids=engine.eos_token_ids)
        self.engine = engine
        self.model = engine.model
        self.max_batch_size = max_batch_size
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        # HF fills every generation field a call leaves unset from the model's generation config; with
        # EOS ids there, `ignore_eos` could never turn them off. Every call passes its stop ids instead.
        self.model.generation_config.eos_token_id = None
        self._lock = threading.Lock()  # one of: a generation batch, a weight load, a memory move
        self._running = 0
        self._weights_backup: dict[str, torch.Tensor] | None = None
        self._thread = threading.Thread(target=self._serve, name="relax-engine", daemon=True)

    @property
    def hf_config(self) -> dict[str, Any]:
        """The checkpoint's config (for /get_model_info)."""
        return self.model.config.to_dict()

    @property
    def stats(self) -> dict[str, int]:
        return self._counts

    # -- generation -----------------------------------------------------------------------------------------
    def submit(self, requests: list[GenerationRequest]) -> list[concurrent.futures.Future[GenerationOutput]]:
        """Queue the requests; each future resolves to its output (or EngineUnavailable)."""
        return self._enqueue([_Job(r, concurrent.futures.Future()) for r in requests])

    # abort: ServingBase's; running rows read `aborted` between decode steps (`_RowStops`)

    def load(self) -> dict[str, int]:
        """Requests waiting (queued, or in a later group of the current round) and running."""
        with self._cond:
            return {"waiting": len(self._jobs) - self._running, "running": self._running}

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if self._closing:
                    for job in self._pending:
                        job.future.set_exception(EngineUnavailable("the engine is shutting down"))
                    return
                jobs, self._pending = self._pending, []
            groups: dict[tuple[Any, ...], list[_Job]] = {}
            for job in jobs:  # insertion order: the first-queued group runs first
                groups.setdefault(job.request.sampling.batch_key(), []).append(job)
            for group in groups.values():
                self._run_group(group)

    def _run_group(self, group: list[_Job]) -> None:
        with self._cond:
            self._running += len(group)
        outputs: list[GenerationOutput] | None = None
        error: Exception | None = None
        try:
            with self._lock:
                outputs = self._generate_group(group)
        except Exception as exc:  # noqa: BLE001 - every waiting caller gets the error, the worker lives on
            if not isinstance(exc, EngineUnavailable | ProtocolError):
                log.exception("generation failed for %d request(s)", len(group))
            error = exc
        with self._cond:  # bookkeeping before any caller wakes: a follow-up /flush_cache sees an idle engine
            self._running -= len(group)
            for job in group:
                self._jobs.pop(job.request.rid, None)
        for index, job in enumerate(group):
            if outputs is None:
                job.future.set_exception(error or RuntimeError("generation failed"))
            else:
                outputs[index].e2e_latency = time.perf_counter() - job.submitted
                job.future.set_result(outputs[index])

    @torch.no_grad()
    def _generate_group(self, group: list[_Job]) -> list[GenerationOutput]:
        self._require_memory()
        sampling = group[0].request.sampling  # batch-level fields are equal across the group
        outputs: dict[int, GenerationOutput] = {}
        runnable = []
        for index, job in enumerate(group):
            if job.aborted is not None:
                outputs[index] = self._empty_output(job, Finish.abort(job.aborted))
            elif job.request.sampling.max_new_tokens == 0:  # prefill only (prompt log-probs)
                outputs[index] = self._empty_output(job, Finish.max_length(0))
            else:
                runnable.append((index, job))
        seed = batch_seed([job.request.sampling.seed for _, job in runnable])
        if runnable and seed is not None:
            torch.manual_seed(seed)  # once per group, then chunk: as TorchRolloutEngine.generate does
        for start in range(0, len(runnable), self.max_batch_size):
            chunk = runnable[start : start + self.max_batch_size]
            generated = self._generate_chunk([job for _, job in chunk], sampling)
            for (index, _), out in zip(chunk, generated, strict=True):
                outputs[index] = out
        for index, job in enumerate(group):
            if job.request.return_logprob and job.request.logprob_start_len >= 0:
                self._add_prompt_logprobs(outputs[index], job.request)
        for out in outputs.values():
            out.weight_version = self.weight_version  # under the engine lock: the weights it ran with
        self._counts["requests"] += len(group)
        self._counts["generated_tokens"] += sum(len(o.output_ids) for o in outputs.values())
        return [outputs[i] for i in range(len(group))]

    def _empty_output(self, job: _Job, finish: Finish) -> GenerationOutput:
        return GenerationOutput(
            rid=job.request.rid,
            prompt_tokens=len(job.request.input_ids),
            output_ids=[],
            output_logprobs=[],
            finish=finish,
            text=None if self.tokenizer is None else "",
            output_top_logprobs=[] if job.request.top_logprobs_num > 0 else None,
        )

    def _generate_chunk(self, jobs: list[_Job], sampling: RequestSampling) -> list[GenerationOutput]:
        """One HF `generate` over the rows, configured as `TorchRolloutEngine._generate_chunk` (left padding,
        explicit sampling fields, raw logits kept). Per-row limits and stop strings end rows through
        `_RowStops`; the batch runs to the longest row's limit."""
        engine = self.engine
        prompts = [job.request.input_ids for job in jobs]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), engine.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        stop_ids = self._stop_ids(sampling)
        greedy = sampling.greedy
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_k=None if greedy else sampling.top_k,  # 0: off (HF adds no top-k warper)
            top_p=None if greedy else sampling.top_p,
            min_p=None if greedy or sampling.min_p <= 0 else sampling.min_p,
            # neutral values set explicitly, or HF would take the model's generation-config defaults
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            max_new_tokens=max(job.request.sampling.max_new_tokens for job in jobs),
            min_new_tokens=sampling.min_new_tokens or None,  # suppresses eos_token_id, i.e. stop_ids
            eos_token_id=list(stop_ids) or None,
            pad_token_id=engine.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        row_stops = _RowStops(jobs, width, self.tokenizer)
        device = engine.device.torch_device
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([row_stops]),
        )
        new_tokens = out.sequences[:, width:].cpu()  # [B, L]
        logits = torch.stack(out.logits, dim=1).float().cpu()  # [B, L, V], raw (before any processor)
        if sampling.min_new_tokens and stop_ids:
            # SGLang reports log-probs of the distribution it sampled from, stop tokens masked
            logits[:, : sampling.min_new_tokens, list(stop_ids)] = float("-inf")
        log_probs = torch.log_softmax(logits / sampling.logprob_temperature, dim=-1)  # [B, L, V]
        token_log_probs = log_probs.gather(-1, new_tokens[..., None]).squeeze(-1)  # [B, L]
        stop_set = set(stop_ids)
        outputs = []
        for row, job in enumerate(jobs):
            ids = new_tokens[row].tolist()
            end, finish = _resolve_finish(
                ids, stop_set, row_stops.finished[row], job.request.sampling.max_new_tokens
            )
            top = None
            if job.request.top_logprobs_num > 0:
                k = min(job.request.top_logprobs_num, log_probs.shape[-1])
                values, indices = log_probs[row, :end].topk(k)
                top = [
                    list(zip(v.tolist(), i.tolist(), strict=True))
                    for v, i in zip(values, indices, strict=True)
                ]
            outputs.append(
                GenerationOutput(
                    rid=job.request.rid,
                    prompt_tokens=len(job.request.input_ids),
                    output_ids=ids[:end],
                    output_logprobs=token_log_probs[row, :end].tolist(),
                    finish=finish,
                    text=self._detokenize(ids[:end], finish, job.request.sampling),
                    output_top_logprobs=top,
                )
            )
        return outputs

    def _detokenize(self, ids: list[int], finish: Finish, sampling: RequestSampling) -> str | None:
        return detokenize(self.tokenizer, ids, finish, sampling)

    def _add_prompt_logprobs(self, out: GenerationOutput, request: GenerationRequest) -> None:
        """SGLang's input_token_logprobs: tokens from logprob_start_len on, the first entry None, the others
        log p(token | prefix) of the raw logits (SGLang applies no temperature to prompt log-probs)."""
        ids = request.input_ids
        start = min(request.logprob_start_len, len(ids))
        logits = self.model(input_ids=torch.tensor([ids], device=self.engine.device.torch_device)).logits[0]
        log_probs = torch.log_softmax(logits.float().cpu(), dim=-1)  # [P, V]; row j predicts token j + 1
        values: list[float | None] = [None]
        top: list[list[tuple[float, int]] | None] = [None]
        for position in range(start + 1, len(ids)):
            values.append(float(log_probs[position - 1, ids[position]]))
            if request.top_logprobs_num > 0:
                v, i = log_probs[position - 1].topk(min(request.top_logprobs_num, log_probs.shape[-1]))
                top.append(list(zip(v.tolist(), i.tolist(), strict=True)))
        tokens = ids[start:]
        out.input_logprobs = values[: len(tokens)]
        out.input_ids_for_logprobs = tokens
        out.input_top_logprobs = top[: len(tokens)] if request.top_logprobs_num > 0 else None

    # -- weights --------------------------------------------------------------------------------------------
    def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None) -> str:
        """Load every weight of a HF folder (safetensors or .bin); a missing tensor is an error."""
        weights = read_hf_weights(model_path)
        with self._lock:
            self._require_resident("update_weights_from_disk")
            check_weight_version(self.weight_version, weight_version)
            self.engine.load_weights(weights, self.engine.weight_version + 1)
            return self._finish_disk_update(model_path, weight_version)

    def update_weights_from_tensors(
        self, named_tensors: Mapping[str, torch.Tensor], *, weight_version: str | None = None
    ) -> str:
        """Load some or all weights by HF name (SGLang's callers send buckets); unknown names and shape
        mismatches are errors and leave the weights untouched."""
        with self._lock:
            self._require_resident("update_weights_from_tensor")
            check_weight_version(self.weight_version, weight_version)
            state = self.model.state_dict()
            check_named_tensors(named_tensors, {name: tuple(t.shape) for name, t in state.items()})
            self.model.load_state_dict(dict(named_tensors), strict=False)
            return self._finish_tensor_update(weight_version)

    def update_weights_from_distributed(
        self, named_tensors: Mapping[str, torch.Tensor], *, weight_version: str | None = None
    ) -> str:
        """One received bucket of a distributed update (`ServingBase._distributed_bucket`)."""
        with self._lock:
            self._require_resident("update_weights_from_distributed")
            state = self.model.state_dict()
            optional = {"lm_head.weight"} if self.engine._is_tied("lm_head.weight") else set()
            shapes = {name: tuple(t.shape) for name, t in state.items() if name not in optional}

            def copy(named: Mapping[str, torch.Tensor]) -> None:
                self.model.load_state_dict(
                    {k: v for k, v in named.items() if k not in optional}, strict=False
                )

            message = self._distributed_bucket(
                named_tensors, weight_version, shapes=shapes, optional=optional, copy=copy
            )
            if weight_version is not None:
                self.engine.weight_version += 1
            return message

    @property
    def torch_device(self) -> torch.device:
        return self.engine.device.torch_device

    def set_weight_version(self, version: str) -> None:
        with self._lock:
            self.weight_version = version

    def named_weight(self, name: str) -> torch.Tensor:
        """A copy of one weight by its HF name (tests, debugging)."""
        return self.model.state_dict()[name].detach().to("cpu", copy=True)

    # -- memory ---------------------------------------------------------------------------------------------
    def release_memory(self, tags: list[str] | None) -> None:
        """Weights go to a CPU backup (a new storage, also on CPU) and the parameters become empty, so the
        device memory is actually freed; generation is refused until resumed. No tags: all."""
        wanted = self._tags(tags)
        with self._lock:
            if MemoryTag.WEIGHTS in wanted and MemoryTag.WEIGHTS not in self._released:
                backup = {}
                for name, param in self.model.named_parameters():  # tied parameters appear once
                    backup[name] = param.detach().to("cpu", copy=True)
                    param.data = torch.empty(0, dtype=param.dtype, device=param.device)
                self._weights_backup = backup
                self.engine.device.empty_cache()
                self._counts["memory_releases"] += 1
            self._released |= wanted

    def resume_memory(self, tags: list[str] | None) -> None:
        wanted = self._tags(tags)
        with self._lock:
            if MemoryTag.WEIGHTS in wanted and self._weights_backup is not None:
                device = self.engine.device.torch_device
                for name, param in self.model.named_parameters():
                    param.data = self._weights_backup[name].to(device)
                self._weights_backup = None
            self._released -= wanted

    def memory_state(self) -> dict[str, Any]:
        params = list(self.model.parameters())
        return {
            "device": str(self.engine.device.torch_device),
            **self._released_state(),
            "weight_bytes_resident": sum(p.numel() * p.element_size() for p in params),
            "weight_bytes_offloaded": sum(
                t.numel() * t.element_size() for t in (self._weights_backup or {}).values()
            ),
        }


def _resolve_finish(
    ids: list[int], stop_set: set[int], custom: tuple[int, Finish] | None, max_new_tokens: int
) -> tuple[int, Finish]:
    """(number of response tokens, finish reason) of one row. The earliest of the first stop token and
    the recorded stop string / abort wins (a stop string on the same token wins, as in SGLang), if it
    lies within the row's max_new_tokens; else the row is cut at max_new_tokens with `length`. A stop
    token as the last allowed token is a stop, as in `TorchRolloutEngine` (SGLang checks the length
    first and reports `length` there)."""
    eos_end = next((i + 1 for i, token in enumerate(ids) if token in stop_set), None)
    if custom is not None and (eos_end is None or custom[0] <= eos_end):
        if custom[0] <= max_new_tokens:
            return custom
    elif eos_end is not None and eos_end <= max_new_tokens:
        return eos_end, Finish.stop_token(ids[eos_end - 1])
    return min(len(ids), max_new_tokens), Finish.max_length(max_new_tokens)


class _RowStops(StoppingCriteria):
    """Per-row stops HF `generate` does not have: each row's own max_new_tokens, SGLang stop strings and
    aborts. Records stop strings and aborts with the number of response tokens at that point; HF then
    pads the row until the batch ends."""

    def __init__(self, jobs: list[_Job], width: int, tokenizer: PreTrainedTokenizerBase | None) -> None:
        self.jobs = jobs
        self.width = width
        self.tokenizer = tokenizer
        self.done = [False] * len(jobs)
        self.finished: list[tuple[int, Finish] | None] = [None] * len(jobs)
        # Decoding only the tail is enough: a character is at most 4 byte-level tokens, and a match that
        # ended earlier would have stopped the row earlier.
        self.windows = [4 * max((len(s) for s in j.request.sampling.stop), default=0) + 8 for j in jobs]
        if tokenizer is None and any(j.request.sampling.stop for j in jobs):
            raise ProtocolError("stop strings need a tokenizer; this server runs with --skip-tokenizer-init")

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        steps = input_ids.shape[1] - self.width
        for row, job in enumerate(self.jobs):
            if self.done[row]:
                continue
            sampling = job.request.sampling
            if job.aborted is not None:
                self.finished[row] = (steps, Finish.abort(job.aborted))
            elif sampling.stop and self.tokenizer is not None:
                tail_start = max(self.width, input_ids.shape[1] - self.windows[row])
                tail = self.tokenizer.decode(input_ids[row, tail_start:].tolist(), skip_special_tokens=False)
                matched = next((s for s in sampling.stop if s in tail), None)
                if matched is not None:
                    self.finished[row] = (steps, Finish.stop_string(matched))
            self.done[row] = self.finished[row] is not None or steps >= sampling.max_new_tokens
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]
