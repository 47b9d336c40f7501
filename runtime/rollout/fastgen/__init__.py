"""fastgen: the GPU rollout engine (continuous batching, static per-slot KV cache, CUDA-graph decode,
on-device sampling with per-token log-probs, abort). Pure PyTorch; no flash-attn, triton or vLLM needed.

Select it in place of the HF-`generate` engine with the same constructor arguments::

    from runtime.rollout.fastgen import FastGenEngine
    engine = FastGenEngine(hf_checkpoint, device=Device.detect(), max_batch_size=512)
    results = engine.generate(prompts, SamplingParams(...), budgets)   # -> list[GenerationResult]

`bench/gpu_rollout.py` measures it against HF `generate`. Our SGLang-protocol server runs it through
`runtime/rollout/sglang/fastgen_serving.py` (continuous batching over HTTP; chosen by
`RELAX_ROLLOUT_BACKEND` / `--relax-engine`, see runtime/rollout/backend.py; `bench/gpu_serving.py`
measures that path). The in-process rollout actor still uses `TorchRolloutEngine`.
"""

from runtime.rollout.fastgen.engine import FastGenEngine
from runtime.rollout.fastgen.model import ModelConfig

__all__ = ["FastGenEngine", "ModelConfig"]
