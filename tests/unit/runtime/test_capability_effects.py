"""Honest capabilities (issue 10, item 7): every parameter the job spec accepts is read by the backend that
runs the job, or refused by name.

Generated over every field of `jobspec.spec.FIELDS` x the backends {torch, megatron}: the parameter is set
away from its default (a value derived from its type: another choice, default + 1, the flipped switch, a
path inside a temporary folder, ...) on the backend's example job (examples/grpo-arith*.yaml, normalized).

- not honoured by the backend (`runtime.capabilities.BACKEND_PARAMETERS`): `unsupported_parameters` must
  name it;
- honoured, but every alternative value refused by its restriction: named too (`name=value`);
- honoured with an accepted value: the parameter needs evidence of an effect in `EFFECTS`, one of
  - `Probe`: builds what the runtime builds from the spec (`train_config_from`, `role_plan`,
    `ParallelLayout.from_values`, `model_args_for`, `transformer_config`, the megatron backend's DDP and
    optimizer configs, the rollout's `SamplingParams`, the eval sets, the checkpoint schedule, ...) with the
    parameter at its default and at the changed value, and asserts the two differ;
  - `ExistingTest`: the node id of an existing test that shows its effect (the function must exist and name the
    parameter);
  - `Derived`: a parameter Relax derives, which the runtime reads through the named parameters.

`SKIPPED` lists the fields for which no valid alternative value exists, with the reason.
"""

from __future__ import annotations

import ast
import atexit
import dataclasses
import functools
import json
import re
import shutil
import tempfile
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from pydantic import TypeAdapter

from jobspec.spec import FIELDS, FieldSpec, JobSpec
from runtime.capabilities import BACKEND_PARAMETERS, BACKENDS, RESTRICTIONS, unsupported_parameters
from runtime.spec import RuntimeSpec, load_spec, read_spec_file
from runtime.trackers import WANDB_PARAMETERS

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = {"torch": "grpo-arith.yaml", "megatron": "grpo-arith-megatron.yaml"}
DEFAULTS: dict[str, Any] = {name: field.default for name, field in FIELDS.items()}
_UNSET: Any = object()

# One folder for every path-valued alternative (nothing is written there by the refusal checks).
FOLDER = Path(tempfile.mkdtemp(prefix="capability-effects-"))
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)
# A valid `--autoscaler-config` (runtime/rollout/elastic.py reads it when the roles are planned).
AUTOSCALER = FOLDER / "autoscaler.yaml"
AUTOSCALER.write_text("min_engines: 1\nmax_engines: 3\nscale_out: {threshold: 0.5}\n")


# -- the jobs the parameters are set on ------------------------------------------------------------------------
@functools.cache
def _example(backend: str) -> tuple[tuple[str, Any], ...]:
    raw, name = read_spec_file(ROOT / "examples" / EXAMPLES[backend])
    raw = {k: (str(FOLDER / "ref") if isinstance(v, str) and "://" in v else v) for k, v in raw.items()}
    raw["prompt-data"] = str(FOLDER / "prompts.jsonl")  # written by the probes that read it
    raw["eval-prompt-data"] = ["arith", str(FOLDER / "eval.jsonl")]
    return tuple(load_spec(raw, name=name).values().items())


def base_values(backend: str) -> dict[str, Any]:
    """The backend's example job, normalized (Relax's derived defaults included), platform references
    replaced by local paths."""
    return json.loads(json.dumps(dict(_example(backend))))


def problems_of(values: Mapping[str, Any], name: str) -> list[str]:
    """What the capability check says about `name` for this job (`name` or `name=value`)."""
    return [p for p in unsupported_parameters(values, DEFAULTS) if re.split(r"[=]", p)[0] == name]


# -- a value away from the default -----------------------------------------------------------------------------
@functools.cache
def _adapter(name: str) -> TypeAdapter | None:
    info = JobSpec.model_fields[name]
    try:
        return TypeAdapter(
            typing.Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
        )
    except Exception:  # noqa: BLE001 - a type pydantic cannot adapt alone: values go unchecked
        return None


def _valid(name: str, value: Any) -> bool:
    adapter = _adapter(name)
    if adapter is None:
        return True
    try:
        adapter.validate_python(value)
    except Exception:  # noqa: BLE001 - pydantic's ValidationError, or a validator's own error
        return False
    return True


def _in_bounds(field: FieldSpec, value: float) -> bool:
    return (
        (field.ge is None or value >= field.ge)
        and (field.gt is None or value > field.gt)
        and (field.le is None or value <= field.le)
    )


def _numbers(field: FieldSpec, integer: bool) -> list[Any]:
    default = field.default
    if isinstance(default, int | float) and not isinstance(default, bool):
        pool = (
            [default + 1, default + 2, default - 1, 1, 2, 0]
            if integer
            else [default + 0.5, default * 2, default / 2, default - 0.5, 0.5, 0.25, 1.0, 0.0]
        )
    else:
        pool = [1, 2, 4, 8] if integer else [0.5, 0.25, 1.0, 2.0]
    return [int(v) if integer else float(v) for v in pool if _in_bounds(field, v)]


def candidates(name: str) -> list[Any]:
    """Values away from `name`'s default, from its type, choices and arity; the valid ones, in order."""
    field = FIELDS[name]
    kind, default = field.kind, field.default
    path = str(FOLDER / name)
    out: list[Any]
    if kind in ("flag", "negatable", "flag_off", "bool_value"):
        out = [True, False] if default is None else [not default]
    elif kind == "passthrough":
        out = [{"mem_fraction_static": 0.5}, {"log_level": "info"}]
    elif kind == "json":
        out = [{"alt": "value"}, {"alt": 1}, {"actor": [1, 1]}]
    elif kind == "append":
        out = [[["alt-value"]], [[path]]]
    elif kind == "list":
        if field.choices:
            items = [[c] for c in field.choices]
        elif field.item_type == "int":
            items = [[1], [2]]
        elif field.item_type == "float":
            items = [[0.5], [1.0]]
        elif field.path_kind is not None:
            items = [["alt", path], [path]]
        else:
            items = [["alt-value"]]
        if isinstance(field.nargs, int):
            items = [item * field.nargs for item in items]
        out = items
    elif field.pattern == "layers":
        out = ["2", 2]
    elif field.pattern == "int_tuple":
        out = ["128,0", "64,0"]
    elif kind == "int":
        out = [int(c) for c in field.choices] if field.choices else _numbers(field, integer=True)
    elif kind == "float":
        out = _numbers(field, integer=False)
    elif field.choices:
        out = list(field.choices)
    elif field.path_kind is not None:
        out = [path]
    elif field.function_path:
        out = ["my_package.my_module.my_function"]
    else:
        out = ["alt-value", "2"]
    return [v for v in out if v != default and v is not None and _valid(name, v)]


def classify(backend: str, name: str) -> tuple[str, Any, dict[str, Any]]:
    """(verdict, value, job): "refused" where `name` is not honoured by the backend; "refused_value" where
    it is but every alternative value is refused; "honoured" with the first accepted value (a probe's own
    value and job first); "skipped" where no valid alternative exists."""
    values = candidates(name)
    job = base_values(backend)
    if not values:
        return "skipped", None, job
    if name not in BACKEND_PARAMETERS[backend]:
        return "refused", values[0], job
    evidence = evidence_for(backend, name)
    job = {**job, **getattr(evidence, "base", {})}
    if isinstance(evidence, Probe) and evidence.value is not _UNSET:
        values = [evidence.value, *(v for v in values if v != evidence.value)]
    for value in values:
        if not problems_of({**job, name: value}, name):
            return "honoured", value, job
    return "refused_value", values[0], job


# -- evidence --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Probe:
    """`observe(values)` with the parameter at its default (or `before`) and at the changed value (or
    `value`) on the backend's example job (plus `base`): the two observations must differ, and the changed
    value must pass the capability check."""

    observe: Callable[[dict[str, Any]], Any]
    base: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    value: Any = _UNSET
    before: Any = _UNSET

    def check(self, backend: str, name: str, value: Any) -> None:
        values = {**base_values(backend), **self.base}
        after_value = value if self.value is _UNSET else self.value
        before_value = DEFAULTS[name] if self.before is _UNSET else self.before
        after = {**values, name: after_value}
        assert not problems_of(after, name), (name, after_value, problems_of(after, name))
        seen_before = self.observe({**values, name: before_value})
        seen_after = self.observe(after)
        assert seen_before != seen_after, (
            f"{name}: {before_value!r} -> {after_value!r} changes nothing {self.observe.__name__} builds"
        )


@dataclasses.dataclass(frozen=True)
class ExistingTest:
    """An existing test that shows the effect: `path::function` (the function must exist and name the
    parameter, by its underscored name or its flag)."""

    node: str

    def check(self, backend: str, name: str, value: Any) -> None:
        path, _, function = self.node.partition("::")
        source_path = ROOT / path
        assert source_path.is_file(), self.node
        source = source_path.read_text(encoding="utf-8")
        found = [
            node
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function
        ]
        assert found, f"{self.node}: no such test"
        text = "".join(
            ast.get_source_segment(source, part) or "" for part in (*found[0].decorator_list, found[0])
        )
        flag = FIELDS[name].flag
        assert re.search(rf"(?<![\w-])({re.escape(name)}|{re.escape(flag)})(?![\w-])", text), (
            f"{self.node} does not mention {name}"
        )


@dataclasses.dataclass(frozen=True)
class Derived:
    """Relax derives the parameter; the runtime reads it through `through` (parameters the same backend
    honours and evidences)."""

    through: tuple[str, ...]
    why: str
    base: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # where it is accepted

    def check(self, backend: str, name: str, value: Any) -> None:
        assert self.why, name
        for other in self.through:
            assert other in BACKEND_PARAMETERS[backend], (
                f"{name} is read through {other}, refused by {backend}"
            )
            assert other in EFFECTS and other != name, (
                f"{name} is read through {other}, which has no evidence"
            )


Evidence = Probe | ExistingTest | Derived


# -- what the runtime builds from a spec (the probes' observations) --------------------------------------------
def _spec(values: Mapping[str, Any]) -> RuntimeSpec:
    return RuntimeSpec.from_mapping(values)


def train_config(values: dict[str, Any]) -> Any:
    """`pipeline.train_config_from`: what either backend's trainer is built with (TrainConfig)."""
    from runtime.pipeline import train_config_from

    return train_config_from(_spec(values), 300)


def advantages(values: dict[str, Any]) -> Any:
    """The advantages stage: `pipeline.advantage_config`, and `RLPipeline.compute_advantages` on a batch."""
    import torch

    from runtime.pipeline import RLPipeline, advantage_config

    spec = _spec(values)
    batch = _batch()
    batch.old_log_probs = -0.5 * batch.loss_mask
    batch.ref_log_probs = -0.7 * batch.loss_mask
    batch.values = torch.zeros_like(batch.loss_mask)
    batch.teacher_log_probs = -0.9 * batch.loss_mask  # OPD's teacher: a per-token KL of 0.4
    RLPipeline.compute_advantages(SimpleNamespace(spec=spec, reward=None), batch)  # type: ignore[arg-type]
    computed = (
        None if batch.advantages is None else [round(x, 5) for x in batch.advantages.flatten().tolist()]
    )
    return advantage_config(spec, rewards_normalization=True), computed


def dataset(values: dict[str, Any]) -> Any:
    """`pipeline.dataset_config`: how prompts are read and rendered."""
    from runtime.pipeline import dataset_config

    return dataset_config(_spec(values))


def plan(values: dict[str, Any]) -> Any:
    """`pipeline.role_plan` (the roles a job starts, on CPU), without the spec's values it carries for the
    megatron backend (those are the megatron probes' business)."""
    from runtime.devices import Device, DeviceKind
    from runtime.pipeline import role_plan

    return dataclasses.replace(role_plan(_spec(values), 300, Device(DeviceKind.CPU)), values={})


def total_rollouts(values: dict[str, Any]) -> Any:
    """`RuntimeSpec.total_rollouts` (the job's length, of a 100-prompt set) and the samples per rollout."""
    spec = _spec(values)
    return spec.total_rollouts(100), spec.samples_per_rollout


def sampling(values: dict[str, Any]) -> Any:
    """`RolloutContext.sampling`: the SamplingParams of a training rollout."""
    from runtime.rollout.context import RolloutContext
    from runtime.rollout.generate import LengthLimits

    ctx = RolloutContext(
        spec=_spec(values), data=None, engine=None, tokenizer=None, reward=None, limits=LengthLimits(8)
    )  # type: ignore[arg-type]
    return ctx.sampling(3), ctx.sampling(3, round_index=1)


def predict(values: dict[str, Any]) -> Any:
    """`SFTPipeline._predict_context`: SamplingParams and length limits of eval-style generation."""
    from runtime.pipeline import SFTPipeline

    fake = SimpleNamespace(
        spec=_spec(values),
        roles=SimpleNamespace(rollout=object(), use_for_rollout=lambda: None),
        tokenizer=None,
    )
    ctx = SFTPipeline._predict_context(fake, 3)  # type: ignore[arg-type]
    return ctx.params, ctx.limits


class _WordTokenizer:
    """One token per word; enough for prompt lengths."""

    chat_template = None
    eos_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": list(range(len(text.split())))}


EVAL_ROWS = [
    {"input": "two words", "label": "1", "q": "question", "answer": "2", "tools": [], "fn": [{"name": "f"}]},
    {
        "input": "a longer prompt of six words",
        "label": "3",
        "q": "other",
        "answer": "4",
        "fn": [{"name": "g"}],
    },
]


def eval_sets(values: dict[str, Any]) -> Any:
    """`eval.load_eval_datasets`: every RL eval set with its keys, items and sampling."""
    from runtime.eval import load_eval_datasets

    path = FOLDER / "eval.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in EVAL_ROWS))
    out = []
    for d in load_eval_datasets(_spec(values), _WordTokenizer()):
        items = [(i.prompt, i.label, i.tools) for i in d.items]
        out.append((d.name, d.path, items, d.n_samples, d.temperature, d.top_p, d.top_k, d.max_response_len))
        out.append((d.max_context_len, d.min_new_tokens, d.stop, d.stop_token_ids, d.formatter.config))
    return out


def _batch() -> Any:
    from runtime.types import RolloutBatch, Sample

    samples = [
        Sample(i, i // 4, "p", tokens=list(range(3, 9 + i % 3)), response_length=3, reward=float(i % 3))
        for i in range(8)
    ]
    return RolloutBatch.from_samples(samples, 0)


def wiring(values: dict[str, Any]) -> Any:
    """`pipeline.rl.build_rl` (an RL job's rollout side: data source, rollout source, hooks, length limits,
    eval sets) over fake shared parts with a one-prompt data set."""
    from runtime.data.prompts import PromptFormatter, PromptItem
    from runtime.pipeline import PipelineParts, dataset_config
    from runtime.pipeline.rl import build_rl

    spec = _spec(values)
    (FOLDER / "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in EVAL_ROWS))
    parts = PipelineParts(
        spec=spec,
        reporter=None,
        tokenizer=_WordTokenizer(),
        roles=SimpleNamespace(rollout=object()),
        total_rollouts=300,
        checkpoints=None,
        weight_sync=None,
        relay=None,
    )
    items = [PromptItem(0, "one prompt", "1", {}, {"input": "one prompt", "label": "1"})]
    built = build_rl(parts, PromptFormatter(_WordTokenizer(), dataset_config(spec)), items)
    if built.reward is not None:
        built.reward.close()
    generation = built.generation
    source = built.source
    ctx, data = (generation.ctx, generation.data) if generation is not None else (None, None)
    live = getattr(source, "inner", source)
    rollout_fn = getattr(live, "rollout_fn", None)
    return {
        "postprocess": built.postprocess,
        "eval_fn": generation.eval_fn if generation is not None else None,
        "rollout_fn": rollout_fn.__closure__[0].cell_contents if rollout_fn is not None else None,
        "data": None
        if data is None
        else (
            type(data).__name__,
            data.init.n_samples_per_prompt,
            data.init.shuffle,
            data.init.seed,
            getattr(data, "buffer_filter", None),
        ),
        "source": type(source).__name__,
        "save_debug": getattr(live, "save_debug", None),
        "loaded": (getattr(source, "template", None), getattr(source, "subsample", None)),
        "staleness": [source.gate.may_start(r) for r in range(6)] if hasattr(source, "gate") else None,
        "ctx": None
        if ctx is None
        else (ctx.limits, ctx.dynamic_filter, ctx.custom_generate, [d.name for d in ctx.eval_datasets]),
    }


def debug_train_data(values: dict[str, Any]) -> Any:
    """`PipelineBase._save_due`: the files a step writes besides its checkpoint (`save-debug-train-data`)."""
    from runtime.pipeline import PipelineBase

    written = FOLDER / "save_debug_train_data"  # the alternative value's path (a file, or a folder)
    if written.is_dir():
        shutil.rmtree(written)
    written.unlink(missing_ok=True)
    spec = dataclasses.replace(_spec(values), save=None)
    fake = SimpleNamespace(spec=spec, checkpoints=SimpleNamespace(due=lambda k: False, collect=lambda: None))
    PipelineBase._save_due(fake, 0, _batch())  # type: ignore[arg-type]
    return sorted(str(p) for p in FOLDER.rglob("*") if p.is_file() and "save_debug_train_data" in str(p))


def skip_special_tokens(values: dict[str, Any]) -> Any:
    """`RolloutContext.generate`: the GenerateContext a (custom) generate function gets."""
    from runtime.rollout.context import RolloutContext
    from runtime.rollout.generate import LengthLimits
    from runtime.types import Sample

    seen: list[bool] = []

    def custom(sample: Any, ctx: Any) -> Any:
        seen.append(ctx.skip_special_tokens)
        return sample

    ctx = RolloutContext(
        spec=_spec(values),
        data=None,
        engine=None,
        tokenizer=None,
        reward=None,
        limits=LengthLimits(8),
        custom_generate=custom,
    )  # type: ignore[arg-type]
    ctx.generate([Sample(0, 0, "p", tokens=[1, 2])], 0)
    return seen


def pipeline_build(values: dict[str, Any]) -> Any:
    """`pipeline.build_pipeline` up to starting the roles: the prompts it reads and keeps (the tokenizer is
    one token per word; `start_roles` is replaced by a recorder)."""
    from runtime.devices import Device, DeviceKind
    from runtime.pipeline import build as pipeline_module

    (FOLDER / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in EVAL_ROWS))
    (FOLDER / "prompts-b.jsonl").write_text(json.dumps(EVAL_ROWS[1]) + "\n")
    real_drop, real_split = pipeline_module.drop_long_prompts, pipeline_module.split_eval_holdout
    kept: list[Any] = []

    def dropping(items: Any, formatter: Any, max_len: Any) -> Any:
        out = real_drop(items, formatter, max_len)
        kept.append(("prompts", [i.prompt for i in items], [i.prompt for i in out[0]]))
        return out

    def splitting(items: Any, size: Any, seed: Any) -> Any:
        train, held_out = real_split(items, size, seed)
        kept.append(("sft", [i.prompt for i in train], [i.prompt for i in held_out]))
        return train, held_out

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise _Stop

    with (
        mock.patch.object(pipeline_module, "drop_long_prompts", dropping),
        mock.patch.object(pipeline_module, "split_eval_holdout", splitting),
        mock.patch.object(pipeline_module.AutoTokenizer, "from_pretrained", lambda *a, **k: _WordTokenizer()),
        mock.patch.object(pipeline_module, "start_roles", stop),
        pytest.raises(_Stop),
    ):
        pipeline_module.build_pipeline(_spec(values), None, device=Device(DeviceKind.CPU))  # type: ignore[arg-type]
    return kept


def sft_wiring(values: dict[str, Any]) -> Any:
    """`pipeline.sft.build_sft` (an SFT job's data: the example builder, its oversize policy, the prompt
    order, the eval rows) over fake shared parts."""
    from runtime.data.prompts import PromptFormatter, PromptItem
    from runtime.pipeline import PipelineParts, dataset_config
    from runtime.pipeline.sft import build_sft

    spec = _spec(values)
    (FOLDER / "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in EVAL_ROWS))
    parts = PipelineParts(
        spec=spec,
        reporter=None,
        tokenizer=_WordTokenizer(),
        roles=None,
        total_rollouts=300,
        checkpoints=None,
        weight_sync=None,
        relay=None,
    )
    items = [PromptItem(i, f"prompt {i}", "1", {}, {"input": f"prompt {i}"}) for i in range(8)]
    sft = build_sft(parts, PromptFormatter(_WordTokenizer(), dataset_config(spec)), items, [])
    cursor = sft.cursor
    return (
        sft.builder.label_key,
        sft.builder.oversize,
        (cursor.shuffle, cursor.seed, cursor._epoch_order(0)),
        [(i.prompt, i.label) for i in sft.eval_items],
    )


def rewards(values: dict[str, Any]) -> Any:
    """`RewardModel.from_spec`'s configuration (`RewardConfig.from_values`)."""
    from runtime.rewards.model import RewardConfig

    return RewardConfig.from_values(values)


def pipeline_schedule(values: dict[str, Any]) -> Any:
    """When the pipeline evaluates (`RLPipeline.eval_due`), whether the policy trains (`policy_trains`), when
    the engines take new weights (`sync_weights`), over 300 rollouts."""
    from runtime.pipeline import RLPipeline

    spec = _spec(values)
    pushed: list[bool] = []
    fake = SimpleNamespace(
        spec=spec,
        generation=SimpleNamespace(ctx=SimpleNamespace(eval_datasets=["eval"])),
        total_rollouts=300,
        source=SimpleNamespace(trained=lambda steps_done: None),
        push_weights=lambda version, engines: pushed.append(engines),
    )
    evals = [RLPipeline.eval_due(fake, k) for k in range(301)]  # type: ignore[arg-type]
    trains = [RLPipeline.policy_trains(fake, k) for k in range(20)]  # type: ignore[arg-type]
    for k in range(20):
        RLPipeline.sync_weights(fake, k)  # type: ignore[arg-type]
    return evals, trains, pushed


def checkpoints(values: dict[str, Any]) -> Any:
    """`saving.CheckpointManager`: which rollouts save, blocking or not, where, the HF exports and the
    retention policy."""
    from runtime.saving import CheckpointManager

    calls: list[tuple] = []

    class Train:
        def save_checkpoint(self, save: str, step: int, state: dict, *, blocking: bool) -> None:
            calls.append(("save", save, step, blocking))

        def export_hf(self, path: str, step: int) -> Any:
            calls.append(("export", path, step))
            return SimpleNamespace(format="hf", step=step, path=path, size_bytes=0)

        def finished_saves(self, *, wait: bool = False) -> list:
            calls.append(("collect", wait))
            return []

    reporter = SimpleNamespace(checkpoint=lambda record: None, event=lambda *args: None)
    manager = CheckpointManager(_spec(values), reporter, Train())  # type: ignore[arg-type]
    due = [k for k in range(120) if manager.due(k)]
    for k in due[:3]:
        manager.save(k, {})
    return due, calls, manager.policy


def resume(values: dict[str, Any]) -> Any:
    """`PipelineBase.resume`: the checkpoint it loads and the rollout it starts from."""
    from runtime.pipeline import PipelineBase

    loads: list[str] = []
    fake = SimpleNamespace(
        spec=_spec(values),
        roles=SimpleNamespace(
            train=SimpleNamespace(load_checkpoint=lambda path: loads.append(path)),
            critic=SimpleNamespace(load_checkpoint=lambda path: loads.append("critic:" + path)),
        ),
    )
    return PipelineBase.resume(fake), loads  # type: ignore[arg-type]


def critic(values: dict[str, Any]) -> Any:
    """`pipeline.critic_plan` (PPO's critic) and where its checkpoints go (`critic_save_root`)."""
    from runtime.pipeline import critic_plan
    from runtime.train.critic import critic_save_root

    spec = _spec(values)
    root = critic_save_root(spec.critic_save, spec.save)
    return critic_plan(spec, 300, "/model"), root


def demand(values: dict[str, Any]) -> Any:
    """`jobspec.demand.compute_demand`: the GPUs and nodes the scheduler reserves."""
    from jobspec.demand import compute_demand

    return compute_demand(values)


# megatron --------------------------------------------------------------------------------------------------
MODEL = {  # a tiny architecture given by flags alone (no config.json)
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "vocab_size": 256,
    "seq_length": 128,
    "max_position_embeddings": 256,
}
MOE = {**MODEL, "num_experts": 4, "add_bias_linear": False}  # (megatron: no MoE biases with ETP > 1)


def layout(values: dict[str, Any]) -> Any:
    """`ParallelLayout.from_values` on 64 ranks."""
    from runtime.train.megatron.parallel import ParallelLayout

    return ParallelLayout.from_values(values, 64, num_layers=16)


def model_args(values: dict[str, Any]) -> Any:
    """`model.model_args_for`: the architecture (ModelArgs) the model is built from."""
    from runtime.train.megatron.model import model_args_for

    return model_args_for(values, None)


def megatron_config(values: dict[str, Any]) -> Any:
    """`model.transformer_config` (megatron-core's TransformerConfig) of the job's model on 8 ranks."""
    from runtime.train.megatron.model import model_args_for, transformer_config
    from runtime.train.megatron.parallel import ParallelLayout

    args = model_args_for(values, None)
    config = transformer_config(
        args, ParallelLayout.from_values(values, 8, num_layers=args.num_layers), values=values
    )
    return {f.name: repr(getattr(config, f.name, None)) for f in dataclasses.fields(config)}


def moe_experts(values: dict[str, Any]) -> Any:
    """`model.layer_spec` of an MoE layer: the class megatron builds its routed experts from (megatron 0.16
    describes it by a ModuleSpec, 0.19 by a partial)."""
    from runtime.train.megatron.model import layer_spec, model_args_for

    mlp = layer_spec(model_args_for(values, None), moe=True).submodules.mlp
    experts = (mlp.keywords["submodules"] if isinstance(mlp, functools.partial) else mlp.submodules).experts
    return getattr(experts, "module", getattr(experts, "func", None)).__name__


def permute_fusion(values: dict[str, Any]) -> Any:
    """`model.transformer_config`'s moe_permute_fusion, and whether megatron's fused-permutation slot
    (`moe_utils.fused_permute`, TransformerEngine's) then holds ours (kernels.install_moe_permute_fusion)."""
    from megatron.core.transformer.moe import moe_utils

    from runtime.train.megatron import kernels

    on = megatron_config(values)["moe_permute_fusion"] == "True"
    return on, on and getattr(moe_utils, "fused_permute", None) is kernels.fused_permute


def ddp_config(values: dict[str, Any]) -> Any:
    """`MegatronTrainBackend._wrap_ddp`: megatron's DistributedDataParallelConfig."""
    from runtime.train.megatron.backend import MegatronTrainBackend

    fake = SimpleNamespace(values=values, model_config=None)
    MegatronTrainBackend._wrap_ddp(fake, [])  # type: ignore[arg-type]
    return fake.ddp_config


def optimizer_config(values: dict[str, Any]) -> Any:
    """`MegatronTrainBackend._build_optimizer`: megatron's OptimizerConfig (get_megatron_optimizer is
    replaced by a recorder: no model is built)."""
    from runtime.train.megatron.backend import MegatronTrainBackend
    from runtime.train.megatron.model import _dtype

    seen: list[Any] = []

    def recorder(config: Any, models: Any) -> Any:
        seen.append(config)
        return SimpleNamespace(scale_loss=lambda loss: loss)

    dtype = _dtype(values)
    fake = SimpleNamespace(
        values=values,
        config=train_config(values),
        model_config=SimpleNamespace(
            bf16=str(dtype) == "torch.bfloat16", fp16=str(dtype) == "torch.float16", params_dtype=dtype
        ),
        ddp_config=SimpleNamespace(overlap_param_gather=False, overlap_grad_reduce=False),
        ddp_models=[],
    )
    with mock.patch("megatron.core.optimizer.get_megatron_optimizer", recorder):
        MegatronTrainBackend._build_optimizer(fake)  # type: ignore[arg-type]
    return seen


class _Stop(Exception):
    pass


def loss_head(values: dict[str, Any]) -> Any:
    """`MegatronTrainBackend._token_stats`: the chunk size the vocab-parallel loss head is called with."""
    import torch

    from runtime.train.megatron import backend

    seen: list[dict] = []

    def head(hidden: Any, weight: Any, targets: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return torch.zeros(targets.shape), torch.zeros(targets.shape)

    fake = SimpleNamespace(
        values=values,
        layout=SimpleNamespace(sequence_parallel=False, tp=1, cp=1),
        args=SimpleNamespace(tied=False, vocab_size=8),
        config=SimpleNamespace(log_probs_temperature=1.0),
        tp_group=None,
    )
    micro = backend.padded_micro(
        SimpleNamespace(
            batch_size=1, tokens=torch.zeros((1, 4), dtype=torch.long), loss_mask=torch.ones((1, 4))
        ),  # type: ignore[arg-type]
        1,
        4,
    )
    if hasattr(backend.MegatronTrainBackend, "_chunk_tokens"):
        fake._chunk_tokens = functools.partial(backend.MegatronTrainBackend._chunk_tokens, fake)
    gpt = SimpleNamespace(output_layer=SimpleNamespace(weight=None))
    # (no grad: a forward-only pass, as the log-probs are computed)
    with mock.patch.object(backend, "token_log_probs_and_entropy", head), torch.no_grad():
        backend.MegatronTrainBackend._token_stats(fake, micro, gpt, torch.zeros((4, 1, 8)))  # type: ignore[arg-type]
    return [kwargs["chunk_tokens"] for kwargs in seen]


def process_group(values: dict[str, Any]) -> Any:
    """`MegatronTrainBackend.__init__` up to joining the process group (`init_process_group` recorded)."""
    from runtime.devices import Device, DeviceKind
    from runtime.train.base import TrainContext
    from runtime.train.megatron import backend

    seen: list[tuple] = []

    def recorder(*args: Any, **kwargs: Any) -> None:
        seen.append((args, kwargs))
        raise _Stop

    context = TrainContext(rank=0, world_size=1, master_port=1, values=values)
    with (
        mock.patch.object(backend, "init_process_group", recorder),
        mock.patch.object(backend.dist, "is_initialized", lambda: False),
    ):
        with pytest.raises(_Stop):
            backend.MegatronTrainBackend(
                "/model", train_config(values), device=Device(DeviceKind.CPU), context=context
            )
    return seen


def checkpoint_load(values: dict[str, Any]) -> Any:
    """`MegatronTrainBackend.load_checkpoint`: what it restores (optimizer, RNG) from a checkpoint with an
    optimizer (the loading itself is replaced by a recorder)."""
    from runtime.train.megatron import backend

    seen: list[dict] = []

    def sharded_state(**kwargs: Any) -> None:
        seen.append(kwargs)
        raise _Stop

    fake = SimpleNamespace(values=values, ref_models=None, _sharded_state=sharded_state)
    found = (3, FOLDER / "iter_0000003", {"has_optimizer": True, "has_reference": False})
    with mock.patch.object(backend.ckpt, "latest", lambda load_dir: found):
        with pytest.raises(_Stop):
            # the load itself (`load_checkpoint` only wraps it in `_on_device`)
            backend.MegatronTrainBackend._load_checkpoint(fake, str(FOLDER / "ckpt"))  # type: ignore[arg-type]
    return seen


def server_args(values: dict[str, Any]) -> Any:
    """The SGLang server arguments of every engine the job starts (`RolePlan.engine_args`)."""
    return plan(values).engine_args


def trackers(values: dict[str, Any]) -> Any:
    """What the experiment trackers write where (`runtime.trackers.tracker_plan`: TensorBoard's folder, W&B's
    `init` arguments), with no environment and a fixed run-name suffix."""
    from runtime.trackers import tracker_plan

    return tracker_plan(values, output_dir=FOLDER / "job", run_name="job", env={}, suffix="abc123")


# -- the evidence of each honoured parameter -------------------------------------------------------------------
PPO = {"advantage_estimator": "ppo"}
SFT = {"loss_type": "sft", "use_kl_loss": False, "eval_prompt_data": None, "rollout_global_dataset": False}
HOOK = "json.dumps"  # a dotted path to a callable, where the hook is loaded
# on-policy distillation with the trainer's teacher, in advantage mode and in loss mode
OPD = {"use_opd": True, "opd_type": "megatron", "opd_teacher_load": str(FOLDER / "teacher")}
OPD_LOSS = {**OPD, "opd_kl_coef": 0.0, "opd_loss_coef": 1.0}


WANDB = {"use_wandb": True}

EFFECTS: dict[str, Evidence | dict[str, Evidence]] = {
    # -- the platform's webhooks and the experiment trackers --
    "notify_urls": ExistingTest(
        "tests/integration/test_webhooks.py::test_notify_urls_get_every_status_change_signed_with_the_jobs_secret"
    ),
    "use_tensorboard": Probe(trackers),
    "tb_project_name": Probe(trackers),
    "tb_experiment_name": Probe(trackers),
    "use_wandb": Probe(trackers),  # honoured only where wandb is installed (else refused: RESTRICTIONS)
    **{name: Probe(trackers, base=WANDB) for name in WANDB_PARAMETERS if name != "wandb_mode"},
    "wandb_mode": Probe(trackers, base=WANDB, value="offline"),
    # -- trainer configuration (both backends build their trainer from TrainConfig) --
    "lr": Probe(train_config),
    "min_lr": Probe(train_config),
    "lr_decay_style": Probe(train_config),
    "lr_warmup_iters": Probe(train_config),
    "lr_decay_iters": Probe(train_config),
    "weight_decay": Probe(train_config),
    "adam_beta1": Probe(train_config),
    "adam_beta2": Probe(train_config),
    "adam_eps": Probe(train_config),
    "clip_grad": Probe(train_config),
    "seed": Probe(train_config),
    "global_batch_size": Probe(train_config),
    "micro_batch_size": Probe(train_config),
    "use_dynamic_batch_size": Probe(train_config, base={"max_tokens_per_gpu": 4096}),
    "max_tokens_per_gpu": Probe(train_config, base={"use_dynamic_batch_size": True}),
    "log_probs_max_tokens_per_gpu": Probe(train_config),
    "num_steps_per_rollout": Probe(train_config, base={"global_batch_size": None}, value=2),
    "rollout_batch_size": Probe(train_config, value=64, before=32),
    "n_samples_per_prompt": Probe(wiring),
    "rollout_temperature": Probe(train_config),
    "no_save_optim": Probe(train_config),
    "ref_load": Probe(train_config),
    "ref_ckpt_step": Probe(train_config),
    "ref_update_interval": Probe(train_config),
    "only_train_params_name_list": Probe(train_config),
    "freeze_params_name_list": Probe(train_config),
    # the loss (TrainConfig.loss)
    "loss_type": Probe(train_config),
    "eps_clip": Probe(train_config),
    "eps_clip_high": Probe(train_config),
    "eps_clip_c": Probe(train_config, value=3.0),
    "use_kl_loss": Probe(train_config),
    "kl_loss_coef": Probe(train_config),
    "kl_loss_type": Probe(train_config),
    "use_unbiased_kl": Probe(train_config),
    # on-policy distillation: the teacher (TrainConfig), its loss mode (TrainConfig.loss.opd), its advantage mode
    "use_opd": Probe(
        train_config, base={"opd_type": "megatron", "opd_teacher_load": str(FOLDER / "teacher")}
    ),
    "opd_type": Probe(
        train_config, base={"use_opd": True, "opd_teacher_load": str(FOLDER / "teacher")}, value="megatron"
    ),
    "opd_teacher_load": Probe(train_config, base={"use_opd": True, "opd_type": "megatron"}),
    "opd_teacher_ckpt_step": Probe(train_config, base=OPD),
    "opd_kl_type": Probe(train_config, base=OPD, value="low_var_kl"),
    "opd_loss_coef": Probe(train_config, base={**OPD, "opd_kl_coef": 0.0}),
    "opd_is_clip": Probe(train_config, base=OPD_LOSS, value=2.0),
    "opd_kl_coef": Probe(advantages, base=OPD),
    "opd_only_reward": Probe(advantages, base=OPD),
    "opd_log_prob_min_clamp": Probe(advantages, base=OPD, value=-0.4),
    "opd_per_token_clip": Probe(advantages, base=OPD, value=0.25),
    "entropy_coef": Probe(train_config),
    "calculate_per_token_loss": Probe(train_config),
    "advantage_estimator": Probe(train_config),
    "sapo_tau_pos": Probe(train_config),
    "sapo_tau_neg": Probe(train_config),
    "use_rollout_logprobs": Probe(train_config),
    "use_tis": Probe(train_config),
    "get_mismatch_metrics": Probe(train_config, base={"custom_tis_function_path": HOOK}),
    "tis_clip": Probe(train_config),
    "tis_clip_low": Probe(train_config),
    "custom_tis_function_path": Probe(train_config, value=HOOK),
    "custom_pg_loss_reducer_function_path": Probe(train_config, value=HOOK),
    "use_opsm": Probe(train_config),
    "opsm_delta": Probe(train_config),
    "value_clip": Probe(train_config),
    "custom_loss_function_path": Probe(train_config, value=HOOK),
    # -- the advantages stage --
    "gamma": Probe(advantages),
    "lambd": Probe(advantages),
    "kl_coef": Probe(advantages),
    "normalize_advantages": Probe(advantages),
    "disable_grpo_std_normalization": Probe(advantages),
    "disable_rewards_normalization": Probe(advantages),
    "disable_compute_advantages_and_returns": Probe(advantages),
    # -- prompts --
    "input_key": Probe(dataset),
    "label_key": Probe(dataset),
    "metadata_key": Probe(dataset),
    "tool_key": Probe(dataset),
    "conversation_key_map": Probe(dataset, value={"from": "role", "value": "content"}),
    "apply_chat_template": Probe(dataset),
    "apply_chat_template_kwargs": Probe(dataset, value={"enable_thinking": False}),
    "system_prompt": Probe(dataset),
    "prompt_data": Probe(
        pipeline_build, before=str(FOLDER / "prompts.jsonl"), value=str(FOLDER / "prompts-b.jsonl")
    ),
    "rollout_shuffle": Probe(wiring),
    "rollout_max_prompt_len": Probe(pipeline_build, value=3),
    "num_rollout": Probe(total_rollouts, before=300, value=100),
    "num_epoch": Probe(total_rollouts, base={"num_rollout": None}, before=1, value=2),
    # -- roles --
    "hf_checkpoint": Probe(plan),
    "resource": Probe(
        plan, value={"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}, base={"colocate": False}
    ),
    "colocate": Probe(plan),
    "hybrid": Probe(plan),
    "fully_async": Probe(plan),
    "debug_rollout_only": Probe(plan),
    # accepted only with --load-debug-rollout-data, which already trains on the loaded rollouts with no engines
    "debug_train_only": Derived(
        ("load_debug_rollout_data",),
        "accepted only with --load-debug-rollout-data, which already trains on the loaded rollouts, no engines",
        base={"load_debug_rollout_data": str(FOLDER / "debug")},
    ),
    "load_debug_rollout_data": Probe(plan),
    "warm_hf_checkpoint_page_cache": Probe(plan),
    "rollout_external": Probe(plan, base={"rollout_external_engine_addrs": ["127.0.0.1:30000"]}),
    "rollout_external_engine_addrs": Probe(plan, base={"rollout_external": True}),
    "sglang": Probe(server_args),
    "critic_lr": Probe(critic, base=PPO),
    "critic_lr_warmup_iters": Probe(critic, base=PPO),
    "critic_save": Probe(critic, base=PPO),
    "critic_load": Probe(resume, base=PPO),
    "critic_train_only": Probe(pipeline_schedule, base=PPO),
    "num_critic_only_steps": Probe(pipeline_schedule, base=PPO),
    "num_gpus_per_node": Probe(demand, value=1, base={"resource": {"actor": [1, 2], "rollout": [1, 2]}}),
    **{
        name: ExistingTest(
            "tests/unit/runtime/test_megatron_backend_plan.py::"
            "test_legacy_layout_flags_size_the_roles_as_resource_does"
        )
        for name in ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus")
    },
    # -- rollout sampling and limits --
    "rollout_top_p": Probe(sampling),
    "rollout_top_k": Probe(sampling),
    "rollout_stop": Probe(sampling),
    "rollout_stop_token_ids": Probe(sampling),
    "rollout_seed": Probe(sampling),
    "rollout_max_response_len": Probe(wiring),
    "rollout_max_context_len": Probe(wiring),
    "eval_temperature": Probe(predict, value=0.5),
    "eval_top_p": Probe(predict),
    "eval_top_k": Probe(predict),
    "eval_max_response_len": Probe(predict),
    "eval_max_context_len": Probe(predict),
    "eval_min_new_tokens": Probe(predict),
    # -- eval sets --
    "eval_prompt_data": Probe(
        eval_sets, value=["renamed", str(FOLDER / "eval.jsonl")], before=["arith", str(FOLDER / "eval.jsonl")]
    ),
    "eval_input_key": Probe(eval_sets, value="q"),
    "eval_label_key": Probe(eval_sets, value="answer"),
    "eval_tool_key": Probe(eval_sets, value="fn"),
    "eval_max_prompt_len": Probe(eval_sets, value=3),
    "n_samples_per_eval_prompt": Probe(eval_sets),
    "eval_config": ExistingTest("tests/unit/runtime/test_eval.py::test_eval_config_resolution_order"),
    "eval_interval": Probe(pipeline_schedule),
    "skip_eval_before_train": Probe(pipeline_schedule),
    "update_weights_interval": Probe(pipeline_schedule),
    "log_passrate": ExistingTest("tests/unit/runtime/test_eval.py::test_eval_metrics_names"),
    # -- the platform's recovery of a lost driver (scheduler/recovery.py) --
    "update_weight_buffer_size": ExistingTest(
        "tests/unit/runtime/test_weight_sync_collective.py::"
        "test_update_weight_buffer_size_sets_the_collective_weight_syncs_buckets"
    ),
    "use_fault_tolerance": ExistingTest(
        "tests/unit/scheduler/test_recovery.py::test_the_restart_limit_is_the_jobs_own_only_with_fault_tolerance"
    ),
    "max_global_restart": ExistingTest(
        "tests/integration/test_recovery_reconcile_fake_ray.py::test_use_fault_tolerance_sets_the_limit_with_max_global_restart"
    ),
    # -- the rollout engines' health check (runtime/roles/engine_health.py) --
    "use_health_check": Probe(plan),
    **{
        name: Probe(plan, base={"use_health_check": True}, value=7.0)
        for name in (
            "rollout_health_check_interval",
            "rollout_health_check_timeout",
            "rollout_health_check_first_wait",
        )
    },
    # -- elastic rollout (runtime/roles/elastic.py): engines of their own, scaled between steps --
    "autoscaler_config": Probe(plan, base={"colocate": False}, value=str(AUTOSCALER)),
    **{
        name: Probe(plan, base={"colocate": False, "autoscaler_config": str(AUTOSCALER)}, value=value)
        for name, value in (
            ("scale_out_timeout", 7.0),
            ("scale_out_partial_success_policy", "keep_partial"),
            ("scale_in_drain_timeout", 7.0),
            ("scale_in_shutdown_timeout", 7.0),
        )
    },
    # -- rewards --
    "rm_type": Probe(rewards, value="gsm8k"),
    "rm_type_fallback": Probe(rewards, value="zero"),
    "rm_type_infer": Probe(rewards),
    "custom_rm_path": Probe(rewards, value=HOOK),
    "custom_reward_post_process_path": Probe(rewards, value=HOOK),
    "rm_url": Probe(rewards),
    "group_rm": Probe(rewards),
    "reward_key": Probe(rewards),
    "eval_reward_key": Probe(rewards),
    "reward_max_concurrency": Probe(rewards),
    # -- checkpoints --
    "save": Probe(checkpoints),
    "save_interval": Probe(checkpoints),
    "rotate_ckpt": Probe(checkpoints),
    "max_actor_ckpt_to_keep": Probe(checkpoints),
    "async_save": Probe(checkpoints),
    "save_hf": Probe(checkpoints),
    "load": Probe(resume),
    "start_rollout_id": Probe(resume),
    # -- rollout hooks, sources and modes (pipeline wiring, shown by their tests) --
    "data_source_path": Probe(wiring, value="runtime.data.source.RolloutDataSource"),
    "rollout_function_path": Probe(wiring, value=HOOK),
    "eval_function_path": Probe(wiring, value=HOOK),
    "buffer_filter_path": Probe(wiring, value=HOOK),
    "dynamic_sampling_filter_path": Probe(wiring, value=HOOK),
    "custom_generate_function_path": Probe(wiring, value=HOOK),
    "rollout_data_postprocess_path": Probe(wiring, value=HOOK),
    "over_sampling_batch_size": ExistingTest(
        "tests/unit/runtime/test_rollout_loop.py::test_over_sampling_and_dynamic_filter_fill_the_batch_and_keep_the_surplus"
    ),
    "partial_rollout": ExistingTest(
        "tests/unit/runtime/test_rollout_loop.py::test_partial_rollout_aborts_recycles_masks_and_protects"
    ),
    "partial_rollout_max_aborted_count": ExistingTest(
        "tests/unit/runtime/test_rollout_loop.py::test_partial_rollout_aborts_recycles_masks_and_protects"
    ),
    "mask_offpolicy_in_partial_rollout": ExistingTest(
        "tests/unit/runtime/test_rollout_loop.py::test_partial_rollout_aborts_recycles_masks_and_protects"
    ),
    "rollout_skip_special_tokens": Probe(skip_special_tokens),
    "max_staleness": Probe(wiring, base={"fully_async": True, "colocate": False}),
    # the trainer is not asked for the old log-probs and the update is the recomputing one's (torch here,
    # megatron DP=2 in test_true_on_policy_megatron.py)
    "true_on_policy_mode": ExistingTest(
        "tests/unit/runtime/test_true_on_policy.py::test_no_recompute_and_the_same_update"
    ),
    "load_debug_rollout_data_subsample": Probe(
        wiring, base={"load_debug_rollout_data": str(FOLDER / "debug")}
    ),
    "save_debug_rollout_data": Probe(wiring),
    "save_debug_train_data": Probe(debug_train_data),
    "dump_details": Derived(
        ("save_debug_rollout_data", "save_debug_train_data"),
        "Relax derives --save-debug-rollout-data and --save-debug-train-data under it",
    ),
    # -- SFT --
    "eval_size": Probe(pipeline_build, base=SFT, value=0.5),
    "sft_predict_interval": Probe(plan, base=SFT),
    "sft_oversize_strategy": Probe(sft_wiring, base=SFT),
    "sft_oversize_custom_function_path": Probe(sft_wiring, base=SFT, value=HOOK),
    # -- platform-level --
    "train_backend": Probe(plan),
    "offload": Derived(("colocate",), "colocated roles offload and onload at every turn, and only they do"),
    "offload_train": ExistingTest(
        "tests/unit/runtime/test_colocated_wiring.py::test_the_role_plan_carries_the_kind_and_the_offload_flags"
    ),
    "offload_rollout": ExistingTest(
        "tests/unit/runtime/test_colocated_wiring.py::test_the_role_plan_carries_the_kind_and_the_offload_flags"
    ),
    "balance_data": ExistingTest(
        "tests/unit/runtime/test_megatron_backend.py::test_balance_data_balances_the_data_parallel_shares"
    ),
    # -- megatron: the layout --
    "tensor_model_parallel_size": Probe(layout),
    "pipeline_model_parallel_size": Probe(layout),
    "num_virtual_stages_per_pipeline_rank": Probe(layout, base={"pipeline_model_parallel_size": 2}, value=2),
    "num_layers_per_virtual_pipeline_stage": Probe(layout, base={"pipeline_model_parallel_size": 2}, value=2),
    "expert_model_parallel_size": Probe(layout),
    "expert_tensor_parallel_size": Probe(layout, value=1),
    "sequence_parallel": Probe(layout),
    # megatron: packed sequences (thd, the default) or padded rows (bshd); both train as the torch backend does
    "qkv_format": {
        "megatron": ExistingTest(
            "tests/unit/runtime/test_megatron_backend.py::test_packed_micro_batches_hold_the_rows_end_to_end"
        )
    },
    # the torch backend refuses anything but 1; on megatron, CP=2 trains as the torch backend does
    "context_parallel_size": {
        "megatron": ExistingTest(
            "tests/unit/runtime/test_megatron_backend.py::test_two_ranks_match_the_torch_backend"
        )
    },
    # -- megatron: the architecture --
    **{
        name: Probe(model_args, base=MODEL, before=MODEL[name], value=2 * MODEL[name])
        for name in ("num_layers", "hidden_size", "vocab_size", "max_position_embeddings")
    },
    "num_attention_heads": Probe(model_args, base=MODEL, before=4, value=8),
    "seq_length": Probe(model_args, base={**MODEL, "max_position_embeddings": None}, before=128, value=64),
    "ffn_hidden_size": Probe(model_args, base=MODEL),
    "group_query_attention": Probe(model_args, base={**MODEL, "num_query_groups": 2}),
    "num_query_groups": Probe(model_args, base={**MODEL, "group_query_attention": True}),
    "kv_channels": Probe(model_args, base=MODEL),
    "padded_vocab_size": Probe(model_args, base=MODEL, value=512),
    "make_vocab_size_divisible_by": Probe(model_args, base=MODEL),
    "rotary_base": Probe(model_args, base=MODEL),
    "rotary_percent": Probe(model_args, base=MODEL, value=0.5),
    "use_rope_scaling": Probe(model_args, base=MODEL),
    "rope_scaling_factor": Probe(model_args, base=MODEL),
    "norm_epsilon": Probe(model_args, base=MODEL),
    "normalization": Probe(model_args, base=MODEL, value="RMSNorm"),
    "add_qkv_bias": Probe(model_args, base=MODEL),
    "add_bias_linear": Probe(model_args, base=MODEL),
    "qk_layernorm": Probe(model_args, base=MODEL),
    "untie_embeddings_and_output_weights": Probe(model_args, base=MODEL),
    "swiglu": Probe(model_args, base=MODEL),
    "position_embedding_type": Probe(model_args, base=MODEL, value="rope"),
    "num_experts": Probe(model_args, base=MODEL),
    **{
        name: Probe(megatron_config, base=MOE)
        for name in (
            "moe_router_topk",
            "moe_ffn_hidden_size",
            "moe_shared_expert_intermediate_size",
            "moe_aux_loss_coeff",
            "moe_router_load_balancing_type",
            "moe_router_score_function",
            "moe_router_pre_softmax",
            "moe_token_dispatcher_type",
            "moe_router_dtype",
            "moe_router_topk_scaling_factor",
        )
    },
    "moe_layer_freq": Probe(megatron_config, base=MOE, value="[1,0,1,0]"),
    "moe_grouped_gemm": Probe(moe_experts, base=MOE),  # SequentialMLP -> GroupedGemmMLP
    "moe_permute_fusion": Probe(permute_fusion, base=MOE),
    # -- megatron: TransformerConfig --
    "bf16": Probe(megatron_config, base=MODEL),
    "fp16": ExistingTest(
        "tests/unit/runtime/test_megatron_backend.py::test_fp16_with_dynamic_loss_scaling_tracks_fp32"
    ),
    "hidden_dropout": Probe(megatron_config, base=MODEL),
    "attention_dropout": Probe(megatron_config, base=MODEL),
    "init_method_std": Probe(megatron_config, base=MODEL),
    "recompute_granularity": Probe(megatron_config, base=MODEL, value="full"),
    "recompute_method": Probe(
        megatron_config, base={**MODEL, "recompute_granularity": "full"}, value="block"
    ),
    "recompute_num_layers": Probe(megatron_config, base={**MODEL, "recompute_granularity": "full"}, value=2),
    "recompute_modules": Probe(
        megatron_config, base={**MODEL, "recompute_granularity": "selective"}, value=["mlp"]
    ),
    # -- megatron: DDP, optimizer, loss scaling, the loss head, the process group --
    "accumulate_allreduce_grads_in_fp32": Probe(ddp_config),
    "overlap_grad_reduce": Probe(ddp_config),
    "overlap_param_gather": Probe(ddp_config),
    "check_for_nan_in_loss_and_grad": Probe(ddp_config),
    "ddp_bucket_size": Probe(ddp_config),
    "ddp_average_in_collective": Probe(ddp_config),
    **{
        name: ExistingTest(
            "tests/unit/runtime/test_megatron_backend.py::test_optimizer_cpu_offload_matches_without"
        )
        for name in (
            "optimizer_cpu_offload",
            "optimizer_offload_fraction",
            "overlap_cpu_optimizer_d2h_h2d",
            "use_precision_aware_optimizer",
        )
    },
    # megatron-core 0.16 overrides it for adam (the offloaded AdamW is torch's either way): it reaches the config
    "use_torch_optimizer_for_cpu_offload": Probe(optimizer_config),
    "store_param_remainders": Derived(
        ("fp16",),
        "Relax derives it off under --fp16 (only off is accepted: the remainders are TransformerEngine's "
        "FusedAdam's, which the backend does not run)",
    ),
    **{
        name: ExistingTest(
            "tests/unit/runtime/test_megatron_backend.py::test_fp16_overflow_skips_the_step_and_lowers_the_scale"
        )
        for name in ("initial_loss_scale", "hysteresis")
    },
    **{
        name: Probe(optimizer_config, base={"bf16": False, "fp16": True})
        for name in ("loss_scale", "min_loss_scale", "loss_scale_window")
    },
    "log_probs_chunk_size": Probe(loss_head, value=1024),
    "distributed_timeout_minutes": Probe(process_group),
    "no_load_optim": Probe(checkpoint_load),
    "no_load_rng": Probe(checkpoint_load),
    "finetune": Probe(checkpoint_load),
    # -- megatron: what Relax derives in every megatron spec --
    "use_distributed_optimizer": Derived(
        (),
        "Relax derives it on in every megatron spec; the backend always runs megatron's distributed optimizer",
    ),
    # (tokenizer_model: accepted only equal to --hf-checkpoint, as Relax derives it: any other value is refused)
    "tokenizer_type": Derived(("hf_checkpoint",), "Relax derives HuggingFaceTokenizer: --hf-checkpoint's"),
    "rope_type": Derived(("position_embedding_type",), "Relax derives rope, the only rope implemented"),
    "dist_ckpt_save_pre_mcore_014": Derived(
        ("save", "load"),
        "Relax derives it on; torch_dist checkpoints are written in the installed megatron-core's layout and "
        "loaded by the layout they record",
    ),
    "apply_rope_fusion": ExistingTest(
        "tests/unit/runtime/megatron/test_model.py::test_no_rope_fusion_keeps_megatrons_own_rope"
    ),
    "use_rotary_position_embeddings": Derived(
        ("position_embedding_type",),
        "Megatron-LM's legacy flag: the spec derives --position-embedding-type rope from it, which the backend reads",
    ),
    "attention_backend": Derived(
        (),
        "auto and flash only: the core attention is SDPA, whose dispatcher runs the flash kernel on CUDA in "
        "bf16/fp16 (the other backends are TransformerEngine's and refused)",
    ),
    "attention_softmax_in_fp32": Derived(
        (),
        "always so here: SDPA's kernels keep the softmax in fp32 (transformer_config sets it on)",
    ),
    "recompute_activations": Derived(
        ("recompute_granularity",),
        "Megatron-LM's shorthand: the spec derives --recompute-granularity selective from it, which the backend "
        "reads",
    ),
    "megatron_to_hf_mode": Derived(
        ("save_hf",),
        "raw and bridge name one Hugging Face <-> Megatron mapping (convert.py): the same weights",
    ),
}

# Fields for which no valid value away from the default exists, with the reason (none today: every field
# has one; a field whose type admits only its default would be listed here).
SKIPPED: dict[str, str] = {}


# -- the generated test ----------------------------------------------------------------------------------------
def evidence_for(backend: str, name: str) -> Evidence | None:
    found = EFFECTS.get(name)
    return found.get(backend) if isinstance(found, dict) else found


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FIELDS))
def test_each_parameter_is_refused_or_has_an_effect(backend: str, name: str) -> None:
    verdict, value, job = classify(backend, name)
    if verdict == "skipped":
        assert name in SKIPPED, f"{name}: no valid value away from {DEFAULTS[name]!r}; list it in SKIPPED"
        pytest.skip(SKIPPED[name])
    assert name not in SKIPPED, f"{name} has a valid alternative {value!r}: remove it from SKIPPED"
    if verdict in ("refused", "refused_value"):
        assert problems_of({**job, name: value}, name), (
            f"{name}={value!r} is neither honoured by the {backend} backend nor refused"
        )
        return
    evidence = evidence_for(backend, name)
    assert evidence is not None, (
        f"{name} is honoured by the {backend} backend ({name}={value!r} passes the capability check) but has no "
        "evidence of an effect: add a probe or a test to EFFECTS, or refuse it in runtime/capabilities.py"
    )
    evidence.check(backend, name, value)


def test_evidence_is_for_honoured_parameters_only() -> None:
    """EFFECTS and SKIPPED do not outlive the parameters they are about."""
    honoured = set().union(*BACKEND_PARAMETERS.values())
    assert set(EFFECTS) <= honoured, sorted(set(EFFECTS) - honoured)
    assert set(SKIPPED) <= set(FIELDS)
    assert set(RESTRICTIONS) <= set(FIELDS)
