"""A forward-only copy of a model (the `reference` and `actor_fwd` roles): per-token log-probs, no optimizer."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from runtime.algos.losses import token_log_probs
from runtime.devices import Device
from runtime.train.torch_backend import position_ids_for
from runtime.types import RolloutBatch


class LogProbModel:
    """Holds an HF causal LM in eval mode; `log_probs(batch)` is [B, T] aligned with `batch.tokens`, masked
    by `batch.loss_mask` (zero elsewhere), computed exactly as the trainer computes its own."""

    def __init__(self, model_path: str, *, device: Device, temperature: float, chunk: int = 256) -> None:
        self.device = device
        self.temperature = temperature
        self.chunk = chunk
        self.model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model.to(device.torch_device).eval().requires_grad_(False)
        self.weight_version = 0

    @torch.no_grad()
    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        device = self.device.torch_device
        parts = []
        for part in batch.micro_batches(self.chunk):
            mask = part.attention_mask.to(device)
            logits = self.model(
                input_ids=part.tokens.to(device), attention_mask=mask, position_ids=position_ids_for(mask)
            ).logits
            parts.append(token_log_probs(logits, part.tokens.to(device), self.temperature).cpu())
        width = batch.tokens.shape[1]
        out = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])
        return out * batch.loss_mask

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        missing, unexpected = self.model.load_state_dict(dict(named_tensors), strict=False)
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        missing = [n for n in missing if not (tied and n == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"weight sync mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
        self.weight_version = version
