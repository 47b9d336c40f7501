"""fastgen behind the SGLang-compatible server: continuous batching with SGLang's request semantics.

The same interface as `ServingEngine` (serving.py), which `server.py` calls: `submit` / `abort` / `load`,
weight updates, memory release, `flush_cache`, `memory_state`, `stats`. What differs is how requests run:

- **Continuous batching.** One worker thread drives `FastGenEngine`'s `submit`/`step` loop. Each
  iteration hands every request queued since the last one to the engine, then runs one engine step (its
  admission prefills new requests into free KV slots, then one decode step for every running sequence).
  A request arriving while others generate therefore starts at the next step, not when a batch ends,
  and a finished sequence frees its slot at once. The engine is built with a slot for every request the
  server may run (`max_batch_size`, SGLang's `--max-running-requests`; on CUDA as many of them as half
  the memory free after loading the weights holds, `cache_memory_fraction`), so an arrival does not wait
  for a slot while fewer run (with every slot taken it takes the next one freed); one that needs a longer
  cache than the one allocated waits until the engine is idle (the cache is then reallocated).
- **Exclusive operations** (weight updates, memory release/resume, `/update_weight_version`) wait for the
  running requests to finish while new ones are held back, then run alone: as SGLang's model-update lock,
  no output mixes two weight versions (send `abort_all_requests` to cut the wait short).
- **Sampling** is fastgen's (`sampler.py`): per-request temperature / top-k / top-p / seed /
  min_new_tokens on the device, its own counter-based RNG, so sampled tokens differ from HF's for the same
  seed (greedy ones agree). Request i of one `/generate` call with `sampling_seed` s draws from
  `mix_seed(s, i)`, as `FastGenEngine.generate` does for its i-th prompt.
- **SGLang semantics added here**: stop ids per request (EOS + `stop_token_ids`, none with `ignore_eos`:
  the engine itself has no EOS), finish reasons with the matched token or string, text trimming,
  log-probs under softmax(logits / T) (T = 1 for greedy) — for the first `min_new_tokens` tokens under the
  masked distribution SGLang samples from (recomputed by one forward, as are `top_logprobs_num` and
  prompt log-probs), aborts by rid or all with the partial output, `weight_version` checks
  (`serving.check_weight_version`). `min_p` is refused (fastgen's sampler has none).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from runtime.devices import Device
from runtime.rollout.fastgen.engine import FastGenEngine
from runtime.rollout.fastgen.sampler import mix_seed
from runtime.rollout.params import FinishReason, GenerationResult, SamplingParams
from runtime.rollout.sglang.protocol import (
    Finish,
    GenerationOutput,
    GenerationRequest,
    ProtocolError,
    RequestSampling,
)
from runtime.rollout.sglang.serving import (
    EngineUnavailable,
    MemoryTag,
    ServingBase,
    check_named_tensors,
    check_weight_version,
    detokenize,
)
from runtime.rollout.sglang.tensor_payload import read_hf_weights

log = logging.getLogger(__name__)

ENGINE_NAME = "relax-fastgen"  # `engine` in /get_server_info


def checkpoint_eos_ids(model_path: str | Path) -> tuple[int, ...]:
    """The checkpoint's EOS ids as `TorchRolloutEngine` takes them: generation_config.json's, else
    config.json's."""
    folder = Path(model_path)
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.exists():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                return tuple(int(t) for t in (eos if isinstance(eos, list) else [eos]))
    return ()


@dataclass(eq=False)
class _Job:
    request: GenerationRequest
    future: concurrent.futures.Future[GenerationOutput]
    seed: int | None  # the engine seed (None: drawn from torch's generator at admission)
    submitted: float = field(default_factory=time.perf_counter)
    aborted: str | None = None  # the abort message once /abort_request names it
    engine_rid: int | None = None  # set once the engine has it


class FastGenServing(ServingBase):
    """Requests in, `GenerationOutput`s out over `FastGenEngine`; see the module docstring."""

    engine_name = ENGINE_NAME

    def __init__(
        self,
        engine: FastGenEngine,
        tokenizer: PreTrainedTokenizerBase | None,
        *,
        model_path: str,
        eos_token_ids: tuple[int, ...],
        hf_config: Mapping[str, Any] | None = None,
        cache_memory_fraction: float = 0.5,
    ) -> None:
        if engine.eos_token_ids:
            raise ValueError(
                "FastGenServing needs an engine built with eos_token_ids=() (it adds them per request)"
            )
        self.engine = engine
        engine.min_slots = engine.max_batch_size  # a slot for every request that may arrive mid-run...
        if engine.torch_device.type == "cuda":  # ... as far as half the free memory holds their cache
            free, _ = torch.cuda.mem_get_info(engine.torch_device)
            engine.max_cache_bytes = int(free * cache_memory_fraction)
        # stop ids per request: the checkpoint's EOS ids plus the request's own
        engine.stop_width = max(engine.stop_width, len(eos_token_ids) + 8)
        super().__init__(tokenizer, model_path=model_path, eos_token_ids=eos_token_ids)
        self.max_batch_size = engine.max_batch_size
        self.vocab_size = engine.cfg.vocab_size
        self._hf_config = dict(hf_config or {})
        self._running: dict[int, _Job] = {}  # in the engine, by engine rid
        self._stepping = False  # the worker is inside the engine (admitting or stepping)
        self._exclusive_wanted = 0  # exclusive operations waiting: hold new requests back
        self._exclusive_held = False
        self._thread = threading.Thread(target=self._serve, name="relax-fastgen", daemon=True)

    @classmethod
    def from_checkpoint(
        cls,
        model_path: str,
        tokenizer: PreTrainedTokenizerBase | None,
        *,
        device: Device,
        max_batch_size: int = 256,
        **engine_kwargs: Any,
    ) -> FastGenServing:
        engine = FastGenEngine(
            model_path,
            device=device,
            max_batch_size=max_batch_size,
            eos_token_ids=(),
            tokenizer=tokenizer,
            **engine_kwargs,
        )
        config = json.loads((Path(model_path) / "config.json").read_text())
        return cls(
            engine,
            tokenizer,
            model_path=model_path,
            eos_token_ids=checkpoint_eos_ids(model_path),
            hf_config=config,
        )

    @property
    def hf_config(self) -> dict[str, Any]:
        return self._hf_config

    @property
    def stats(self) -> dict[str, float]:
        engine = self.engine.stats
        return {
            **self._counts,
            "decode_steps": engine.decode_steps,
            "prefill_tokens": engine.prefill_tokens,
            "shared_prefills": engine.shared_prefills,
            "graph_captures": engine.graph_captures,
            "compactions": engine.compactions,
        }

    # -- generation -----------------------------------------------------------------------------------------
    def submit(self, requests: list[GenerationRequest]) -> list[concurrent.futures.Future[GenerationOutput]]:
        """Queue the requests (joining the running ones at the next engine step); each future resolves to
        its output (or EngineUnavailable)."""
        jobs = []
        for index, request in enumerate(requests):
            self._validate(request.sampling)
            seed = request.sampling.seed
            jobs.append(
                _Job(request, concurrent.futures.Future(), None if seed is None else mix_seed(seed, index))
            )
        return self._enqueue(jobs)

    def _validate(self, sampling: RequestSampling) -> None:
        if sampling.min_p > 0:
            raise ProtocolError("sampling_params.min_p is not supported by the fastgen engine")
        if sampling.stop and self.tokenizer is None:
            raise ProtocolError("stop strings need a tokenizer; this server runs with --skip-tokenizer-init")
        stop_ids = self._stop_ids(sampling)
        if len(stop_ids) > self.engine.stop_width:
            raise ProtocolError(
                f"{len(stop_ids)} stop token ids (EOS included); the fastgen engine allows {self.engine.stop_width}"
            )

    def _aborted(self, job: _Job) -> None:
        """A running request ends after the engine's current step with its partial output."""
        if job.engine_rid is not None:
            self.engine.abort(job.engine_rid)  # thread-safe: applied at the next step

    def load(self) -> dict[str, int]:
        with self._cond:
            running = len(self._running)
            return {"waiting": len(self._jobs) - running, "running": running}

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._closing:
                    admitting = not (self._exclusive_wanted or self._exclusive_held)
                    if (self._pending and admitting) or self.engine.has_unfinished():
                        break
                    self._cond.wait()
                if self._closing:
                    self._fail_all(EngineUnavailable("the engine is shutting down"))
                    return
                new: list[_Job] = []
                if not (self._exclusive_wanted or self._exclusive_held):
                    new, self._pending = self._pending, []
                self._stepping = True
            done: list[tuple[_Job, GenerationOutput | BaseException]] = []
            try:
                self._iterate(new, done)
            except Exception as exc:  # noqa: BLE001 - every caller gets the error; the server stays up
                log.exception("fastgen step failed; failing %d running request(s)", len(self._running))
                done += [(job, exc) for job in self._running.values()]
                self._running.clear()
                self._recover()
            finally:
                with self._cond:  # bookkeeping before any caller wakes (a follow-up /flush_cache sees it)
                    self._stepping = False
                    for job, _ in done:
                        self._jobs.pop(job.request.rid, None)
                    self._cond.notify_all()
            for job, result in done:
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    result.e2e_latency = time.perf_counter() - job.submitted
                    job.future.set_result(result)

    @torch.no_grad()
    def _iterate(self, new: list[_Job], done: list[tuple[_Job, GenerationOutput | BaseException]]) -> None:
        """Admit the new requests, then one engine step; finished requests go to `done`."""
        for job in new:
            try:
                immediate = self._admit(job)
            except Exception as exc:  # noqa: BLE001 - this request's error, not the engine's
                done.append((job, exc))
                continue
            if immediate is not None:
                done.append((job, immediate))
        if not self.engine.has_unfinished():
            return
        for rid, result in self.engine.step():
            job = self._running.pop(rid, None)
            if job is not None:
                done.append((job, self._output(job, result)))

    def _admit(self, job: _Job) -> GenerationOutput | None:
        """Hand the request to the engine (None), or its output when it needs no decoding."""
        self._require_memory()
        request = job.request
        if job.aborted is not None:
            return self._output(job, GenerationResult([], [], FinishReason.ABORT))
        if request.sampling.max_new_tokens == 0:  # prefill only (prompt log-probs)
            return self._output(job, GenerationResult([], [], FinishReason.LENGTH))
        with self._cond:
            if job.aborted is not None:  # aborted while being admitted
                return self._output(job, GenerationResult([], [], FinishReason.ABORT))
            rid = self.engine.submit(request.input_ids, self._params(request.sampling), seed=job.seed)
            job.engine_rid = rid
            self._running[rid] = job
        return None

    def _params(self, sampling: RequestSampling) -> SamplingParams:
        """SGLang's normalised sampling -> fastgen's. Greedy at T = 1 is fastgen's temperature 0 (argmax,
        log-probs under softmax(logits)); greedy at another T keeps T with top_k 1, so log-probs are
        reported at T as SGLang does."""
        plain_greedy = sampling.greedy and sampling.temperature == 1.0
        return SamplingParams(
            temperature=0.0 if plain_greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            top_k=-1 if plain_greedy or sampling.top_k <= 0 else sampling.top_k,
            max_new_tokens=sampling.max_new_tokens,
            stop_token_ids=self._stop_ids(sampling),
            stop=sampling.stop,
            min_new_tokens=sampling.min_new_tokens,
        )

    def _output(self, job: _Job, result: GenerationResult) -> GenerationOutput:
        request, sampling = job.request, job.request.sampling
        ids, log_probs = list(result.token_ids), list(result.log_probs)
        finish = self._finish(job, result)
        stop_ids = self._stop_ids(sampling)
        masked = min(sampling.min_new_tokens, len(ids)) if stop_ids else 0
        prompt_lp = request.return_logprob and request.logprob_start_len >= 0
        top = None
        if masked or request.top_logprobs_num > 0 or prompt_lp:
            prompt = request.input_ids
            logits = self.engine.forward_logits(prompt + ids[:-1] if ids else prompt)  # [P + L - 1, V]
            scaled = torch.log_softmax(logits[len(prompt) - 1 :] / sampling.logprob_temperature, dim=-1)
            if masked:  # SGLang reports the distribution it samples from: stop ids masked
                first = logits[len(prompt) - 1 : len(prompt) - 1 + masked] / sampling.logprob_temperature
                first[:, list(stop_ids)] = float("-inf")
                chosen = torch.tensor(ids[:masked], device=first.device)[:, None]
                log_probs[:masked] = torch.log_softmax(first, dim=-1).gather(-1, chosen).squeeze(-1).tolist()
            if request.top_logprobs_num > 0:
                k = min(request.top_logprobs_num, scaled.shape[-1])
                values, indices = scaled[: len(ids)].topk(k)
                top = [
                    list(zip(v.tolist(), i.tolist(), strict=True))
                    for v, i in zip(values, indices, strict=True)
                ]
        out = GenerationOutput(
            rid=request.rid,
            prompt_tokens=len(request.input_ids),
            output_ids=ids,
            output_logprobs=log_probs,
            finish=finish,
            text=detokenize(self.tokenizer, ids, finish, sampling),
            output_top_logprobs=top,
            weight_version=self.weight_version,  # exclusive updates: the weights the whole output ran with
        )
        if prompt_lp:
            self._add_prompt_logprobs(out, request, logits[: len(request.input_ids)])
        self._counts["requests"] += 1
        self._counts["generated_tokens"] += len(ids)
        return out

    def _finish(self, job: _Job, result: GenerationResult) -> Finish:
        sampling = job.request.sampling
        if result.finish_reason is FinishReason.ABORT:
            return Finish.abort(job.aborted or "Aborted")
        if result.finish_reason is FinishReason.LENGTH or not result.token_ids:
            return Finish.max_length(sampling.max_new_tokens)
        if sampling.stop and self.tokenizer is not None:  # a stop string on the stop token's step wins
            text = self.tokenizer.decode(result.token_ids, skip_special_tokens=False)
            matched = next((s for s in sampling.stop if s in text), None)
            if matched is not None:
                return Finish.stop_string(matched)
        return Finish.stop_token(result.token_ids[-1])

    @staticmethod
    def _add_prompt_logprobs(out: GenerationOutput, request: GenerationRequest, logits: torch.Tensor) -> None:
        """SGLang's input_token_logprobs over the prompt's logits [P, V] (raw: no temperature): tokens from
        logprob_start_len on, the first entry None, the others log p(token | prefix)."""
        ids = request.input_ids
        start = min(request.logprob_start_len, len(ids))
        tokens = ids[start:]
        log_probs = torch.log_softmax(logits[start : len(ids) - 1], dim=-1)  # row j predicts token start+j+1
        following = torch.tensor(ids[start + 1 :], dtype=torch.int64, device=log_probs.device)
        values = log_probs.gather(-1, following[:, None]).squeeze(-1).tolist()
        out.input_logprobs = ([None, *values] if tokens else [])[: len(tokens)]
        out.input_ids_for_logprobs = tokens
        out.input_top_logprobs = None
        if request.top_logprobs_num > 0:
            v, i = log_probs.topk(min(request.top_logprobs_num, log_probs.shape[-1]))
            rows = [list(zip(a, b, strict=True)) for a, b in zip(v.tolist(), i.tolist(), strict=True)]
            out.input_top_logprobs = ([None, *rows] if tokens else [])[: len(tokens)]

    def _fail_all(self, error: BaseException) -> None:
        """(under the condition) every queued and running request gets `error`."""
        for job in list(self._jobs.values()):
            if not job.future.done():
                job.future.set_exception(error)
        self._jobs.clear()
        self._pending.clear()
        self._running.clear()

    def _recover(self) -> None:
        """After a failed step: end whatever the engine still holds, so the next request starts clean."""
        try:
            self.engine.abort_all()
            for _ in range(10_000):
                if not self.engine.has_unfinished():
                    break
                self.engine.step()
        except Exception:  # noqa: BLE001 - best effort; the next step reports what is still wrong
            log.exception("fastgen could not drain its requests after a failure")

    # -- exclusive operations -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold new requests back, wait for the running ones to end, then run alone."""
        with self._cond:
            self._exclusive_wanted += 1
            try:
                while self._exclusive_held or self._stepping or self.engine.has_unfinished():
                    self._cond.wait()
            finally:
                self._exclusive_wanted -= 1
            self._exclusive_held = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive_held = False
                self._cond.notify_all()

    # -- weights --------------------------------------------------------------------------------------------
    def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None) -> str:
        """Load every weight of a HF folder; a missing or unknown tensor, or a shape mismatch, is refused
        before anything is copied."""
        weights = read_hf_weights(model_path)
        with self._exclusive():
            self._require_resident("update_weights_from_disk")
            check_weight_version(self.weight_version, weight_version)
            try:
                self.engine.load_weights(weights, self.engine.weight_version + 1)
            except (KeyError, ValueError) as exc:
                raise ProtocolError(str(exc).strip("'\"")) from None
            return self._finish_disk_update(model_path, weight_version)

    def update_weights_from_tensors(
        self, named_tensors: Mapping[str, torch.Tensor], *, weight_version: str | None = None
    ) -> str:
        """Load some or all weights by HF name (SGLang's callers send buckets, the version with the last);
        unknown names and shape mismatches are refused and leave the weights untouched."""
        weights = self.engine.weights
        with self._exclusive():
            self._require_resident("update_weight_from_tensor")
            check_weight_version(self.weight_version, weight_version)
            shapes = {name: slot.shape for name, slot in weights.hf.items()}
            check_named_tensors(named_tensors, shapes, weights.optional_names())
            weights.copy_in(named_tensors)
            if self.engine.torch_device.type == "cuda":
                torch.cuda.current_stream().synchronize()  # the sources may be freed once we return
            return self._finish_tensor_update(weight_version)

    def update_weights_from_distributed(
        self, named_tensors: Mapping[str, torch.Tensor], *, weight_version: str | None = None
    ) -> str:
        """One received bucket of a distributed update (`ServingBase._distributed_bucket`: checked, then
        copied in place; the bucket with the version refuses a missing tensor)."""
        weights = self.engine.weights
        with self._exclusive():
            self._require_resident("update_weights_from_distributed")

            def copy(named: Mapping[str, torch.Tensor]) -> None:
                weights.copy_in(named)
                if self.engine.torch_device.type == "cuda":
                    torch.cuda.current_stream().synchronize()  # the received buffer goes once we return

            message = self._distributed_bucket(
                named_tensors,
                weight_version,
                shapes={name: slot.shape for name, slot in weights.hf.items()},
                optional=weights.optional_names(),
                copy=copy,
            )
            if weight_version is not None:
                self.engine.weight_version += 1
            return message

    @property
    def torch_device(self) -> torch.device:
        return self.engine.torch_device

    def set_weight_version(self, version: str) -> None:
        with self._exclusive():
            self.weight_version = version

    def named_weight(self, name: str) -> torch.Tensor:
        """A copy of one weight by its HF name (tests, debugging)."""
        return self.engine.weights.target(name).detach().to("cpu", copy=True)

    # -- memory ---------------------------------------------------------------------------------------------
    def release_memory(self, tags: list[str] | None) -> None:
        """Weights to (pinned) host memory, KV cache and CUDA graphs freed; generation is refused until
        resumed. `kv_cache` alone frees the cache and graphs only. No tags: all."""
        wanted = self._tags(tags)
        with self._exclusive():
            if MemoryTag.WEIGHTS in wanted and not self.engine.offloaded:
                self.engine.offload()  # the cache and graphs go with it
                self._counts["memory_releases"] += 1
            elif MemoryTag.KV_CACHE in wanted:
                self.engine.release_cache()
            self._released |= wanted

    def resume_memory(self, tags: list[str] | None) -> None:
        wanted = self._tags(tags)
        with self._exclusive():
            if MemoryTag.WEIGHTS in wanted and self.engine.offloaded:
                self.engine.onload()
            self._released -= wanted  # the cache is reallocated by the next request

    def memory_state(self) -> dict[str, Any]:
        weights = self.engine.weights
        size = weights.numel * weights.flat.element_size()
        offloaded = self.engine.offloaded
        return {
            "device": str(self.engine.torch_device),
            **self._released_state(),
            "weight_bytes_resident": 0 if offloaded else size,
            "weight_bytes_offloaded": size if offloaded else 0,
            "kv_cache_bytes": self.engine.cache_bytes(),  # ours: the static cache fastgen allocated
        }
