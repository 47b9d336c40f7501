"""jobspec: the Relax configuration as a validated job spec (pure pydantic, no I/O).

    from jobspec import normalize
    res = normalize(obj={"rollout_batch_size": 8, ...})   # or normalize(argv=["--rollout-batch-size", "8", ...])
    res.spec.rollout_batch_size, res.warnings, res.derived, res.demand

`JobSpec` is flat (one attribute per Relax parameter) and composed from one model per reference
group (`jobspec.groups`); `jobspec.argv` is the command-line codec; `jobspec.rules` holds every
cross-field rule and derived default; `jobspec.demand` computes the GPU demand.
"""

from jobspec.demand import GpuGroup, ResourceDemand
from jobspec.issues import SpecError, SpecIssue
from jobspec.normalization import NormalizedSpec, normalize
from jobspec.spec import FIELDS, JobSpec, function_path_fields, megatron_fields, path_fields

__all__ = [
    "JobSpec",
    "normalize",
    "NormalizedSpec",
    "SpecError",
    "SpecIssue",
    "ResourceDemand",
    "GpuGroup",
    "FIELDS",
    "path_fields",
    "function_path_fields",
    "megatron_fields",
]
