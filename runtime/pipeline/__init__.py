"""A job's pipeline, built whole from its spec: `RLPipeline` or `SFTPipeline` (each with every field set at
construction), over `PipelineBase` (what both share), picked by `build_pipeline`.

- `plans`: spec -> trainer, critic, role and data configs (pure);
- `base`: the shared fields and stages (policy step, weight push, save, resume, step report, close);
- `rl`, `sft`: each kind's stages and its builder;
- `build`: `build_pipeline`, the one entry the driver calls.
"""

from runtime.pipeline.base import PipelineBase, PipelineParts
from runtime.pipeline.build import Pipeline, build_pipeline
from runtime.pipeline.plans import (
    advantage_config,
    critic_plan,
    dataset_config,
    loss_config_from,
    opd_config,
    role_plan,
    train_config_from,
)
from runtime.pipeline.rl import Generation, RLPipeline
from runtime.pipeline.sft import SFTPipeline

__all__ = [
    "Generation",
    "Pipeline",
    "PipelineBase",
    "PipelineParts",
    "RLPipeline",
    "SFTPipeline",
    "advantage_config",
    "build_pipeline",
    "critic_plan",
    "dataset_config",
    "loss_config_from",
    "opd_config",
    "role_plan",
    "train_config_from",
]
