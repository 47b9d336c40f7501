"""The built-in rollout engine: Hugging Face `generate` on torch, returning tokens with per-token log-probs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, StoppingCriteria

from runtime.devices import Device
from runtime.rollout.params import FinishReason as FinishReason
from runtime.rollout.params import GenerationResult as GenerationResult
from runtime.rollout.params import SamplingParams as SamplingParams

transformers.utils.logging.disable_progress_bar()


class _StopOnStrings(StoppingCriteria):
    """Marks a row done once its generated text contains one of the stop strings."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_width: int) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width :])
        return torch.tensor(
            [any(stop in text for stop in self.stops) for text in texts], device=input_ids.device
        )


def stop_string_end(tokenizer: Any, token_ids: list[int], stops: Sequence[str]) -> int | None:
    """The shortest prefix of `token_ids` whose text contains a stop string (its length), or None.
    Containment only grows with the prefix, so a binary search over prefix lengths finds it."""
    if not stops or not any(stop in tokenizer.decode(token_ids) for stop in stops):
        return None
    low, high = 1, len(token_ids)
    while low < high:
        mid = (low + high) // 2
        if any(stop in tokenizer.decode(token_ids[:mid]) for stop in stops):
            high = mid
        else:
            low = mid + 1
    return low


@dataclass
class EngineStats:
    generated_tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class TorchRolloutEngine:
    """Generates with a local copy of the policy. Log-probs come from the raw logits (HF `output_logits`)
    divided by the temperature, so the trainer's recomputation on the same weights agrees to ~1e-6
    (it must use the same position ids; see `runtime/train/torch_backend.py`)."""

    def __init__(self, hf_checkpoint: str, *, device: Device, max_batch_size: int = 256) -> None:
        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(hf_checkpoint, dtype=torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(hf_checkpoint)  # for stop strings
        self.model.eval()
        self.model.to(device.torch_device)
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.model.config.eos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else (int(eos),)
        pad = gen.pad_token_id if gen.pad_token_id is not None else self.model.config.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_ids[0])
        self.max_batch_size = max_batch_size
        self.weight_version = 0
        self.offloaded = False

    # -- memory: explicit calls so colocated roles can take turns on one device ----------------------
    def offload(self) -> None:
        """Move weights off the accelerator (a no-op move on CPU) and refuse to generate until onload."""
        self.model.to("cpu")
        self.device.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        self.model.to(self.device.torch_device)
        self.offloaded = False

    @property
    def torch_device(self) -> torch.device:
        """Where the weights live while onloaded (`runtime.weight_sync.in_place` hands tensors over there)."""
        return self.device.torch_device

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the weights (names as in the HF state dict), copied into the model's own tensors, and
        record their version. A missing, unknown or misshapen tensor is refused, naming it, before
        anything is copied: a refused update leaves the engine as it was."""
        own = self.model.state_dict()
        missing = [name for name in own if name not in named_tensors and not self._is_tied(name)]
        unexpected = [name for name in named_tensors if name not in own]
        if missing or unexpected:
            raise ValueError(f"weight sync mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
        for name, tensor in named_tensors.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"weight sync: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(own[name].shape)}"
                )
        self.model.load_state_dict(dict(named_tensors), strict=False)
        self.weight_version = version

    def _is_tied(self, name: str) -> bool:
        return name == "lm_head.weight" and bool(getattr(self.model.config, "tie_word_embeddings", False))

    # -- generation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int] | None = None
    ) -> list[GenerationResult]:
        """Continue every token sequence in `prompts`. `budgets[i]` caps request i's new tokens below
        `params.max_new_tokens` (the rest of its response or context length)."""
        if self.offloaded:
            raise RuntimeError("rollout engine is offloaded; call onload() first")
        if params.seed is not None:
            torch.manual_seed(params.seed)
        budgets = budgets if budgets is not None else [params.max_new_tokens] * len(prompts)
        results: list[GenerationResult] = []
        for start in range(0, len(prompts), self.max_batch_size):
            end = start + self.max_batch_size
            results.extend(self._generate_chunk(prompts[start:end], params, budgets[start:end]))
        return results

    def _generate_chunk(
        self, prompts: list[list[int]], params: SamplingParams, budgets: list[int]
    ) -> list[GenerationResult]:
        budgets = [max(0, min(b, params.max_new_tokens)) for b in budgets]
        if max(budgets) == 0:
            return [GenerationResult([], [], FinishReason.LENGTH, self.weight_version) for _ in prompts]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):  # left padding: every prompt ends where generation starts
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        stop_ids = list(dict.fromkeys(self.eos_token_ids + tuple(params.stop_token_ids)))
        greedy = params.temperature <= 0
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_k=None if greedy or params.top_k <= 0 else params.top_k,
            top_p=None if greedy or params.top_p >= 1.0 else params.top_p,
            max_new_tokens=max(budgets),
            min_new_tokens=min(params.min_new_tokens, max(budgets)) or None,
            eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        device = self.device.torch_device
        criteria = [_StopOnStrings(self.tokenizer, params.stop, width)] if params.stop else None
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            stopping_criteria=criteria,
        )
        new_tokens = out.sequences[:, width:].cpu()  # [B, L]
        logits = torch.stack(out.logits, dim=1).float().cpu()  # [B, L, V], raw (before any warper)
        temperature = 1.0 if greedy else params.temperature
        log_probs = (
            torch.log_softmax(logits / temperature, dim=-1).gather(-1, new_tokens[..., None]).squeeze(-1)
        )
        stop_set = set(stop_ids)
        results = []
        for row in range(len(prompts)):
            ids = new_tokens[row].tolist()
            ends = [i + 1 for i, tok in enumerate(ids) if tok in stop_set][:1]
            text_end = stop_string_end(self.tokenizer, ids, params.stop)
            if text_end is not None:
                ends.append(text_end)
            end = min(ends) if ends else None
            reason = FinishReason.STOP
            if end is None or end > budgets[row]:  # stopped (or not) only past this request's budget
                end, reason = min(len(ids), budgets[row]), FinishReason.LENGTH
            results.append(
                GenerationResult(ids[:end], log_probs[row, :end].tolist(), reason, self.weight_version)
            )
        return results
