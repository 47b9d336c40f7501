"""The parameter groups, one model per section of the Relax configuration reference, in reference order."""

from __future__ import annotations

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
    BatchingParams,
    MegatronParams,
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
    MegatronParams,
)

__all__ = ["GROUP_MODELS", *[m.__name__ for m in GROUP_MODELS]]
