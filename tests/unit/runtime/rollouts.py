"""Real rollouts of the tiny model for the training tests: groups of sampled responses with the engine's
log-probs and fixed 0/1 rewards."""

from __future__ import annotations

from runtime.rollout.engine import SamplingParams, TorchRolloutEngine
from runtime.types import Sample


def sample_groups(
    engine: TorchRolloutEngine,
    tok,  # type: ignore[no-untyped-def]
    pairs: list[tuple[int, int]],
    params: SamplingParams,
    per_prompt: int = 4,
) -> list[Sample]:
    """`per_prompt` responses to "What is a + b?" for each pair; every third sample has reward 1."""
    prompts = [tok(f"What is {a} + {b}?", add_special_tokens=False)["input_ids"] for a, b in pairs]
    requests = [p for p in prompts for _ in range(per_prompt)]
    results = engine.generate(requests, params)
    return [
        Sample(
            index=i,
            group_index=i // per_prompt,
            prompt="",
            tokens=p + r.token_ids,
            response_length=len(r.token_ids),
            rollout_log_probs=r.log_probs,
            reward=float(i % 3 == 0),
        )
        for i, (p, r) in enumerate(zip(requests, results, strict=True))
    ]
