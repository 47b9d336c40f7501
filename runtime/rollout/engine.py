"""The built-in rollout engine: Hugging Face `generate` on torch, returning tokens with per-token log-probs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig

from runtime.devices import Device

transformers.utils.logging.disable_progress_bar()


class FinishReason(StrEnum):
    STOP = "stop"  # a stop token was generated (it is the last response token)
    LENGTH = "length"  # max_new_tokens reached first


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling; mirrors the `rollout-*` spec fields. top_k -1 and top_p 1.0 disable them;
    temperature 0 is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()  # added to the model's own EOS ids
    seed: int | None = None  # seeds the sampler for this call (reproducible rollouts)


@dataclass
class GenerationResult:
    token_ids: list[int]  # response ids, the stop token included when finish_reason is STOP
    log_probs: list[float]  # log p(token) under softmax(logits / temperature), one per token
    finish_reason: FinishReason


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

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the weights (names as in the HF state dict) and record their version."""
        missing, unexpected = self.model.load_state_dict(dict(named_tensors), strict=False)
        missing = [name for name in missing if not self._is_tied(name)]
        if missing or unexpected:
            raise ValueError(f"weight sync mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
        self.weight_version = version

    def _is_tied(self, name: str) -> bool:
        return name == "lm_head.weight" and bool(getattr(self.model.config, "tie_word_embeddings", False))

    # -- generation ------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        if self.offloaded:
            raise RuntimeError("rollout engine is offloaded; call onload() first")
        if params.seed is not None:
            torch.manual_seed(params.seed)
        results: list[GenerationResult] = []
        for start in range(0, len(prompts), self.max_batch_size):
            results.extend(self._generate_chunk(prompts[start : start + self.max_batch_size], params))
        return results

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
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
            max_new_tokens=params.max_new_tokens,
            eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        device = self.device.torch_device
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config
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
            end = next((i + 1 for i, tok in enumerate(ids) if tok in stop_set), None)
            reason = FinishReason.STOP if end is not None else FinishReason.LENGTH
            end = end if end is not None else len(ids)
            results.append(GenerationResult(ids[:end], log_probs[row, :end].tolist(), reason))
        return results
