"""One wire type per concept (docs/adr/0008, issue 13 item 1): the API's responses carry a job's status, its
failure reason, a resource demand, an allocation and a spec issue as the one Python declaration of each, the
OpenAPI document (and so the dashboard's generated client) lists them as such, and web/src/api/types.ts only
names generated types."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

import jobspec
from api.schemas.jobs import AllocationPublic, JobDetail, SpecValidation
from jobspec.issues import SpecIssue
from tests.factories import grpo_spec
from wire.jobs import TERMINAL, FailureReason, JobStatus

ROOT = Path(__file__).resolve().parents[3]
WEB_API = ROOT / "web" / "src" / "api"

#: Properties that name a declared concept, and the component each must be (alone, in a list or a map, or null).
TYPED = {
    "status": "JobStatus",
    "from_status": "JobStatus",
    "to_status": "JobStatus",
    "requeued": "JobStatus",
    "failure_reason": "FailureReason",
    "demand": "ResourceDemand",
    "groups": "GpuGroup",
    "allocations": "AllocationPublic",
    "capacity": "Capacity",
    "warnings": "SpecIssue",
    "errors": "SpecIssue",
    "issues": "SpecIssue",  # an error's details
    # a driver's report: the report protocol's items (runtime/report_protocol.py)
    "metrics": "MetricItem",
    "logs": "LogItem",
    "checkpoints": "CheckpointItem",
    "rollouts": "RolloutItem",
    "predictions": "PredictionItem",
    "events": "EventItem",
    "progress": "Progress",
}
#: Objects whose `status` is a concept of their own (OpenAI's shapes), each its declared component.
OWN_STATUS = {
    "FilePublic": "FileStatus",
    "UploadPublic": "UploadStatus",
    "FineTuningJob": "FineTuningJobStatus",
}
#: Other properties of OpenAI's shapes that name a concept of their own, each its declared component.
OWN_CONCEPTS = {("FineTuningJobCheckpoint", "metrics"): "FineTuningCheckpointMetrics"}
#: The objects the API leaves free-form, each for a reason; a new one must be added here (or typed).
FREE_FORM = {
    (
        "AuditEventPublic",
        "details",
    ): "what a route noted of its call (job name, queue, role...): differs by route",
    ("JobCreate", "spec"): "Relax parameters as the user wrote them; jobspec judges them",
    ("SpecValidate", "spec"): "as JobCreate's",
    (
        "EvalCreate",
        "spec",
    ): "Relax parameters of the eval job as the user wrote them; evals.SETTABLE, then jobspec",
    (
        "JobDetail",
        "spec",
    ): "the normalized spec: every Relax parameter (jobspec.JobSpec's hundreds of fields)",
    ("SpecValidation", "spec"): "as JobDetail's",
    ("SpecValidation", "derived"): "the values the rules derive, keyed by parameter",
    (
        "JobDetail",
        "submitted",
    ): "the request as stored (spec or args, launch_script) with warnings, derived, inputs",
    ("LaunchScriptIn", "runtime_env"): "Ray's --runtime-env-json, parsed: Ray's own format",
    ("ValidationError", "ctx"): "FastAPI's own validation error schema",
    (
        "ReinforcementMethod",
        "grader",
    ): "OpenAI's grader object, its fields by its type; judged by scheduler/services/fine_tuning.py",
    ("FineTuningJobCreate", "integrations"): "OpenAI's integrations: refused when given",
    ("FineTuningJobEvent", "data"): "an event's data: a metrics event's step and losses, a checkpoint's step",
}


@pytest.fixture
def openapi(relax_home: Path) -> dict[str, Any]:
    from api.app import create_app

    return create_app().openapi()


def _refs(schema: Any) -> set[str]:
    """The components a property's schema refers to, directly or through anyOf / items / additionalProperties."""
    text = json.dumps(schema)
    return set(re.findall(r'"#/components/schemas/([A-Za-z]+)"', text))


def test_each_concept_is_its_declared_component(openapi: dict[str, Any]) -> None:
    schemas = openapi["components"]["schemas"]
    seen: set[str] = set()
    for name, schema in schemas.items():
        for prop, spec in (schema.get("properties") or {}).items():
            if prop == "status" and name in OWN_STATUS:
                assert _refs(spec) == {OWN_STATUS[name]}, (name, prop, spec)
            elif (name, prop) in OWN_CONCEPTS:
                assert _refs(spec) == {OWN_CONCEPTS[name, prop]}, (name, prop, spec)
            elif prop in TYPED:
                assert _refs(spec) == {TYPED[prop]}, (name, prop, spec)
                seen.add(prop)
            text = json.dumps(spec)
            untyped = '"additionalProperties": true' in text or (
                spec.get("type") == "object" and "additionalProperties" not in spec
            )
            if untyped:
                assert (name, prop) in FREE_FORM, (
                    f"{name}.{prop} is a free-form object: type it (or list why not)"
                )
    assert seen == set(TYPED), f"properties expected and not found: {set(TYPED) - seen}"
    assert {n for n, _ in FREE_FORM} <= set(schemas), (
        "a listed free-form object is gone: drop it from FREE_FORM"
    )


def test_the_enums_list_the_domain_values_in_its_order(openapi: dict[str, Any]) -> None:
    schemas = openapi["components"]["schemas"]
    assert schemas["JobStatus"]["enum"] == [s.value for s in JobStatus]
    assert schemas["FailureReason"]["enum"] == [r.value for r in FailureReason]
    assert schemas["SpecIssue"]["properties"]["severity"]["enum"] == ["error", "warning"]
    # the error envelope's issues are the same component, not an open variant of it
    assert _refs(schemas["ErrorDetails"]["properties"]["issues"]) == {"SpecIssue"}
    assert "additionalProperties" not in schemas["SpecIssue"]


def test_a_spec_issue_is_the_same_object_in_an_error_and_in_the_dry_run() -> None:
    """`SpecIssue.to_dict()` (the 422 error envelope's `details.issues`) and the dry run's typed issue agree."""
    with pytest.raises(jobspec.SpecError) as err:
        jobspec.normalize(obj=grpo_spec(**{"rollout-batch-size": 0, "use-kl-loss": True, "kl-loss-coef": 0}))
    issues = err.value.issues
    assert {i.severity for i in issues} == {"error", "warning"}
    dry = SpecValidation(
        valid=False,
        errors=[i.to_dict() for i in issues if i.is_error],
        warnings=[i.to_dict() for i in issues if not i.is_error],
    ).model_dump(mode="json")
    assert dry["errors"] + dry["warnings"] == [i.to_dict() for i in issues]
    # an issue without `fields` or `severity` (the paths' checks) is completed, as SpecIssue completes it
    wire = TypeAdapter(SpecIssue)
    path_issue = {"code": "spec.bad_path", "field": "save", "message": "m", "hint": "h"}
    assert wire.dump_python(wire.validate_python(path_issue), mode="json") == path_issue | {
        "fields": ["save"],
        "severity": "error",
    }


def test_a_demand_and_allocations_go_out_as_stored() -> None:
    """The demand a job stores (`compute_demand(...).model_dump(mode="json")`) comes back key for key, and an
    allocation row's four columns as the route has always listed them."""
    layout = {"num-gpus-per-node": 4, "resource": {"actor": [1, 4], "rollout": [1, 4]}}
    stored = jobspec.normalize(obj=grpo_spec(**layout)).demand.model_dump(mode="json")
    assert set(stored) == set(JobDetail.model_fields["demand"].annotation.model_fields)  # type: ignore[union-attr]
    job = {
        **dict.fromkeys(JobDetail.model_fields),
        "id": "job_x",
        "name": "x",
        "team_id": "team_x",
        "queue": "q",
        "pool": "p",
        "status": "RUNNING",
        "priority_class": "normal",
        "priority": 0,
        "preemptible": True,
        "labels": {},
        "total_gpus": 4,
        "attempt": 1,
        "preemptions": 0,
        "output_dir": "/o",
        "created_at": "2026-12-05T00:00:00Z",
        "updated_at": "2026-12-05T00:00:00Z",
        "spec": {},
        "submitted": {},
        "demand": stored,
        "allocations": [],
    }
    detail = JobDetail.model_validate(job)
    detail.allocations = [{"node": "n1", "role": "actor", "gpus": 4, "pool": "p"}]  # as the route fills it
    out = detail.model_dump(mode="json")
    assert out["demand"] == stored and out["status"] == "RUNNING"
    assert out["allocations"] == [{"node": "n1", "role": "actor", "gpus": 4, "pool": "p", "releasing": False}]
    assert isinstance(detail.allocations[0], AllocationPublic)


#: Where the job status is read: a list of its values written out there is a second declaration.
PARTS = ("api", "scheduler", "runtime", "jobspec", "client", "bench")
WEB_SRC = ROOT / "web" / "src"


def _status_lists(text: str) -> list[str]:
    """Lists, tuples and sets in `text` that name two or more job statuses as strings (a mapping of statuses to
    something else, such as a colour, is no list of them)."""
    values = "|".join(s.value for s in JobStatus)
    return [
        m.group(0)
        for m in re.finditer(r"\[[^\[\]]*\]|\([^()]*\)|\{[^{}:]*\}", text)
        if len(set(re.findall(rf"""["']({values})["']""", m.group(0)))) >= 2
    ]


def test_the_job_status_is_declared_once() -> None:
    """`wire.jobs` is the one declaration (docs/adr/0012): the scheduler's names are the same objects, the CLI and
    the dashboard read the terminal set from it (the dashboard through the generated `TerminalJobStatus`), and
    no part of the platform writes out a list of statuses of its own."""
    import client.watch
    import scheduler.domain.jobs as domain
    import wire.jobs

    assert (domain.JobStatus, domain.TERMINAL, domain.FailureReason) == (
        wire.jobs.JobStatus,
        wire.jobs.TERMINAL,
        wire.jobs.FailureReason,
    )
    assert client.watch.JobStatus is wire.jobs.JobStatus
    assert TERMINAL == {s for s in JobStatus if s.is_terminal()}
    generated = re.search(
        r"export const terminalJobStatusValues\b[^=]*= (\[[^\]]*\]);",
        (WEB_API / "gen" / "schema.ts").read_text(),
    )
    assert generated is not None and json.loads(generated.group(1)) == [
        s.value for s in JobStatus if s in TERMINAL
    ]
    copies = {
        str(path.relative_to(ROOT)): found
        for part in PARTS
        for path in (ROOT / part).rglob("*.py")
        if (found := _status_lists(path.read_text()))
    } | {
        str(path.relative_to(ROOT)): found
        for path in [*WEB_SRC.rglob("*.ts"), *WEB_SRC.rglob("*.tsx")]
        if "gen" not in path.relative_to(WEB_SRC).parts and (found := _status_lists(path.read_text()))
    }
    assert not copies, f"statuses listed outside wire/jobs.py: {copies}"


def test_the_dashboard_names_generated_types_only() -> None:
    """web/src/api/types.ts: aliases of generated types and lists taken from the generated schema; no
    interface, no object or union type and no list of values written by hand."""
    text = (WEB_API / "types.ts").read_text()
    code = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("//", "/*", "*"))]
    for line in code:
        assert not re.search(r"\binterface\b|\benum\b", line), line
        if line.startswith("export type "):
            assert re.fullmatch(r'export type \w+ = Schemas\["\w+"\];', line), line
        elif line.startswith("export const "):
            assert re.fullmatch(r"export const \w+: readonly \w+\[\] = \w+Values;", line), line
        else:
            assert line.startswith("import "), line
    generated = re.search(
        r"export const jobStatusValues\b[^=]*= (\[[^\]]*\]);", (WEB_API / "gen" / "schema.ts").read_text()
    )
    assert generated is not None and json.loads(generated.group(1)) == [s.value for s in JobStatus]
