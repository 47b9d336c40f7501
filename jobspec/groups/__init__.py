"""The parameter groups, one model per section of the Relax configuration reference, in reference order."""

from __future__ import annotations

from jobspec.arguments import MEGATRON, RELAX, generated_group_specs
from jobspec.fields import ParamGroup
from jobspec.groups.algorithm import (
    AdvantageParams,
    CriticParams,
    FreezingParams,
    KlParams,
    LossParams,
    OffPolicyParams,
    PpoParams,
    RoutingReplayParams,
    SapoParams,
    TrainingOptionsParams,
)
from jobspec.groups.data import DataParams, MultimodalParams, SftParams
from jobspec.groups.evaluation import EvalParams, GenRMParams, OpdParams, RewardParams
from jobspec.groups.infra import BackendParams, CheckpointParams, ClusterParams, TransferQueueParams
from jobspec.groups.operations import (
    DebugParams,
    ElasticParams,
    FaultToleranceParams,
    LoggingParams,
    MiscParams,
    NetworkParams,
    ProfilingParams,
    RouterParams,
)
from jobspec.groups.rollout import (
    CustomFunctionParams,
    DynamicFilteringParams,
    ExternalEngineParams,
    PartialRolloutParams,
    RolloutParams,
    SglangParams,
    WeightUpdateParams,
)
from jobspec.groups.training import (
    MEGATRON_META,
    BatchingParams,
    OptimizerParams,
    ParallelismParams,
    PrecisionParams,
    RecomputeParams,
)

#: Every group, in the order of the reference (the docs and `to_argv()` follow this order).
GROUP_MODELS: tuple[type[ParamGroup], ...] = (
    ClusterParams,
    TransferQueueParams,
    BackendParams,
    CheckpointParams,
    DataParams,
    MultimodalParams,
    RolloutParams,
    DynamicFilteringParams,
    PartialRolloutParams,
    WeightUpdateParams,
    ExternalEngineParams,
    SglangParams,
    CustomFunctionParams,
    BatchingParams,
    ParallelismParams,
    RecomputeParams,
    OptimizerParams,
    PrecisionParams,
    AdvantageParams,
    LossParams,
    PpoParams,
    KlParams,
    SapoParams,
    CriticParams,
    OffPolicyParams,
    RoutingReplayParams,
    TrainingOptionsParams,
    FreezingParams,
    SftParams,
    EvalParams,
    RewardParams,
    GenRMParams,
    OpdParams,
    FaultToleranceParams,
    ElasticParams,
    LoggingParams,
    RouterParams,
    MiscParams,
    DebugParams,
    ProfilingParams,
    NetworkParams,
)

#: The hand-written groups above: the sections of the Relax configuration reference.
REFERENCE_GROUPS: tuple[type[ParamGroup], ...] = GROUP_MODELS


def _generated_groups() -> tuple[type[ParamGroup], ...]:
    """Every Megatron parameter and Relax code flag that no reference section declares, in groups
    named after their argparse groups (see jobspec/arguments.py)."""
    declared_names = {n for m in REFERENCE_GROUPS for n in m.model_fields}
    declared_flags = {
        f
        for m in REFERENCE_GROUPS
        for info in m.model_fields.values()
        if isinstance(info.json_schema_extra, dict)
        for f in (
            info.json_schema_extra.get("flag"),
            *info.json_schema_extra.get("aliases", ()),
            *info.json_schema_extra.get("switches", {}),
        )
        if f
    }
    skip = set(declared_names)
    for source in (MEGATRON, RELAX):
        for dest, entry in source.items():
            if set(entry["flags"]) & declared_flags:
                skip.add(dest)
    models = []
    for group_id, title, description, refs in generated_group_specs(skip):
        namespace: dict[str, object] = {
            "__module__": __name__,
            "__qualname__": title,
            "group": group_id,
            "title": title,
            "description": description,
        }
        for name, ref in refs:
            meta = MEGATRON_META.get(name, {}) if ref.source == "megatron" else {}
            namespace[name] = type(ref)(ref.source, ref.dest, dict(meta))
            skip.add(name)
        cls_name = "".join(part.capitalize() for part in group_id.split("-")) + "Params"
        models.append(type(ParamGroup)(cls_name, (ParamGroup,), namespace))
    return tuple(models)


GENERATED_GROUPS: tuple[type[ParamGroup], ...] = _generated_groups()
GROUP_MODELS = REFERENCE_GROUPS + GENERATED_GROUPS

__all__ = ["GROUP_MODELS", "REFERENCE_GROUPS", "GENERATED_GROUPS", *[m.__name__ for m in REFERENCE_GROUPS]]
