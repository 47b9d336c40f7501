"""Evaluation: eval datasets (`eval-prompt-data` pairs or an `eval-config` file), their aggregation into
`eval/*` metrics (mean reward, truncation, pass@k), SFT perplexity, and SFT prediction files."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import yaml

from runtime.access import PathPolicy
from runtime.data.prompts import (
    DatasetConfig,
    PromptFormatter,
    PromptItem,
    drop_long_prompts,
    read_prompt_items,
)
from runtime.spec import RuntimeSpec
from runtime.types import Sample, SampleStatus

PREDICTIONS_DIR = "predict"


@dataclass
class EvalDataset:
    """One evaluation set with its resolved settings (dataset entry > eval-config defaults > `eval-*`
    parameters > `rollout-*` parameters, as Relax resolves them)."""

    name: str
    path: str
    items: list[PromptItem]
    formatter: PromptFormatter
    n_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_response_len: int | None = None
    max_context_len: int | None = None
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    rm_type: str | None = None  # stamped into each sample's metadata (the reward stage reads it)
    metadata_overrides: dict[str, Any] = field(default_factory=dict)
    custom_generate_function_path: str | None = None

    def metadata(self, item: PromptItem) -> dict[str, Any]:
        merged = dict(item.metadata)
        if self.rm_type is not None:
            merged["rm_type"] = self.rm_type
        merged.update(self.metadata_overrides)
        return merged


_DATASET_KEYS = {
    "name", "path", "rm_type", "input_key", "label_key", "tool_key", "metadata_key", "n_samples_per_eval_prompt",
    "temperature", "top_p", "top_k", "max_response_len", "max_prompt_len", "max_context_len", "min_new_tokens",
    "stop", "stop_token_ids", "metadata_overrides", "custom_generate_function_path",
}  # fmt: skip


def read_eval_config(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """An `eval-config` YAML/JSON file -> (dataset entries, defaults).

    Shape: `{eval: {defaults: {...}, datasets: [...] | {name: {...}}}}` (the `eval:` level is optional).
    Relative dataset paths are relative to the file. OmegaConf interpolation is not supported.
    """
    base = Path(path).parent
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    section = doc.get("eval", doc) if isinstance(doc, dict) else {}
    defaults = dict(section.get("defaults") or {})
    raw = section.get("datasets")
    if isinstance(raw, Mapping):
        entries = [{"name": name, **dict(cfg or {})} for name, cfg in raw.items()]
    elif isinstance(raw, list):
        entries = [dict(cfg or {}) for cfg in raw]
    else:
        raise ValueError(f"eval-config {path}: needs eval.datasets, a list or a mapping of datasets")
    for entry in entries:
        unknown = set(entry) - _DATASET_KEYS
        if unknown or "name" not in entry or "path" not in entry:
            raise ValueError(
                f"eval-config {path}: each dataset needs name and path; unknown keys {sorted(unknown)} "
                f"(known: {sorted(_DATASET_KEYS)})"
            )
        if not Path(entry["path"]).is_absolute():
            entry["path"] = str(base / entry["path"])
    return entries, defaults


def _pick(key: str, entry: Mapping[str, Any], defaults: Mapping[str, Any], *fallbacks: Any) -> Any:
    for source in (entry, defaults):
        if source.get(key) is not None:
            return source[key]
    return next((value for value in fallbacks if value is not None), None)


def load_eval_datasets(spec: RuntimeSpec, tokenizer: Any) -> list[EvalDataset]:
    """Every RL eval set of the job: `eval-config` when set (it overrides `eval-prompt-data`), else the
    `eval-prompt-data` name/path pairs."""
    if spec.eval_config:
        entries, defaults = read_eval_config(spec.eval_config)
        policy = PathPolicy.of(spec)
        if policy is not None:  # the platform checked the file, not what it names now
            policy.check_eval_datasets(entries)
    else:
        pairs = list(spec.eval_prompt_data or [])
        if len(pairs) % 2:
            raise ValueError("eval-prompt-data takes pairs: name path [name path ...]")
        entries, defaults = [{"name": pairs[i], "path": pairs[i + 1]} for i in range(0, len(pairs), 2)], {}
    return [_dataset(spec, tokenizer, entry, defaults) for entry in entries]


def _dataset(
    spec: RuntimeSpec, tokenizer: Any, entry: dict[str, Any], defaults: dict[str, Any]
) -> EvalDataset:
    config = DatasetConfig(
        input_key=_pick("input_key", entry, defaults, spec.eval_input_key, spec.input_key),
        label_key=_pick("label_key", entry, defaults, spec.eval_label_key, spec.label_key),
        metadata_key=_pick("metadata_key", entry, defaults, spec.metadata_key),
        tool_key=_pick("tool_key", entry, defaults, spec.eval_tool_key, spec.tool_key),
        conversation_key_map=dict(spec.conversation_key_map or {}),
        apply_chat_template=spec.apply_chat_template,
        apply_chat_template_kwargs=dict(spec.apply_chat_template_kwargs or {}),
        system_prompt=spec.system_prompt,
    )
    formatter = PromptFormatter(tokenizer, config)
    items = read_prompt_items(entry["path"], config)
    items, _ = drop_long_prompts(
        items, formatter, _pick("max_prompt_len", entry, defaults, spec.eval_max_prompt_len)
    )
    stop = _pick("stop", entry, defaults, spec.rollout_stop) or ()
    stop_ids = _pick("stop_token_ids", entry, defaults, spec.rollout_stop_token_ids) or ()
    return EvalDataset(
        name=str(entry["name"]),
        path=str(entry["path"]),
        items=items,
        formatter=formatter,
        n_samples=int(_pick("n_samples_per_eval_prompt", entry, defaults, spec.n_samples_per_eval_prompt)),
        temperature=float(
            _pick("temperature", entry, defaults, spec.eval_temperature, spec.rollout_temperature)
        ),
        top_p=float(_pick("top_p", entry, defaults, spec.eval_top_p, spec.rollout_top_p)),
        top_k=int(_pick("top_k", entry, defaults, spec.eval_top_k, spec.rollout_top_k)),
        max_response_len=_pick(
            "max_response_len", entry, defaults, spec.eval_max_response_len, spec.rollout_max_response_len
        ),
        max_context_len=_pick(
            "max_context_len", entry, defaults, spec.eval_max_context_len, spec.rollout_max_context_len
        ),
        min_new_tokens=int(_pick("min_new_tokens", entry, defaults, spec.eval_min_new_tokens) or 0),
        stop=tuple([stop] if isinstance(stop, str) else stop),
        stop_token_ids=tuple(stop_ids),
        rm_type=_pick("rm_type", entry, defaults),
        metadata_overrides=dict(_pick("metadata_overrides", entry, defaults) or {}),
        custom_generate_function_path=_pick("custom_generate_function_path", entry, defaults),
    )


# -- aggregation -----------------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `c` correct answers among `n` samples (Chen et al. 2021,
    arXiv:2107.03374): the chance that k samples drawn without replacement include a correct one.

    >>> pass_at_k(4, 0, 2), pass_at_k(4, 4, 1), round(pass_at_k(4, 1, 2), 4)
    (0.0, 1.0, 0.5)
    """
    if not 0 < k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def naive_pass_at_k(correct: list[bool], k: int) -> float:
    """pass@k by enumerating every k-subset (the reference the estimator is tested against)."""
    subsets = list(combinations(correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


def pass_rates(groups: list[list[float]]) -> dict[str, float]:
    """`pass@k` for k = 1, 2, 4, ... up to the group size, averaged over prompt groups; a reward of
    exactly 1 counts as correct (as in Relax). Empty for groups of one sample."""
    size = len(groups[0]) if groups else 0
    if size <= 1 or any(len(g) != size for g in groups):
        return {}
    out = {}
    k = 1
    while k <= size:
        out[f"pass@{k}"] = sum(pass_at_k(size, sum(r == 1 for r in g), k) for g in groups) / len(groups)
        k *= 2
    return out


def eval_metrics(name: str, samples: list[Sample], *, log_passrate: bool) -> dict[str, float]:
    """`eval/<name>` (mean reward), `eval/<name>-truncated_ratio`, `eval/<name>/response_len` and, with
    `log-passrate`, `eval/<name>-pass@k`."""
    if not samples:
        return {}
    rewards = [float(s.reward or 0.0) for s in samples]
    metrics = {
        f"eval/{name}": sum(rewards) / len(rewards),
        f"eval/{name}-truncated_ratio": sum(s.status is SampleStatus.TRUNCATED for s in samples)
        / len(samples),
        f"eval/{name}/response_len": sum(s.response_length for s in samples) / len(samples),
    }
    if log_passrate:
        by_group: dict[int, list[float]] = defaultdict(list)
        for sample in samples:
            by_group[sample.group_index].append(float(sample.reward or 0.0))
        metrics.update({f"eval/{name}-{k}": v for k, v in pass_rates(list(by_group.values())).items()})
    return metrics


def perplexity_metrics(sum_nll: float, num_tokens: int) -> dict[str, float]:
    """SFT eval: `eval/loss` (mean NLL per trained token, the quantity the SFT loss minimizes per token),
    `eval/ppl` = exp(loss), `eval/num_tokens`.

    >>> perplexity_metrics(0.0, 0)
    {'eval/loss': 0.0, 'eval/ppl': 0.0, 'eval/num_tokens': 0.0}
    """
    if num_tokens == 0:
        return {"eval/loss": 0.0, "eval/ppl": 0.0, "eval/num_tokens": 0.0}
    loss = sum_nll / num_tokens
    return {"eval/loss": loss, "eval/ppl": math.exp(loss), "eval/num_tokens": float(num_tokens)}


def write_predictions(save: str | Path, rollout_id: int, rows: list[dict[str, str]]) -> Path:
    """`<save>/predict/predictions_step_<rollout_id>.jsonl`: one `{prompt, reference, completion}` per line."""
    path = Path(save) / PREDICTIONS_DIR / f"predictions_step_{rollout_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


# -- eval-only jobs ---------------------------------------------------------------------------------------------
def eval_only(spec: RuntimeSpec) -> bool:
    """Whether the job only evaluates: no trainer (`debug-rollout-only`), no rollout left to run
    (`start-rollout-id` at `num-rollout`) and eval sets given. Relax's loop runs the rollouts
    `range(start_rollout_id, num_rollout)` after one evaluation at `start_rollout_id`, so such a run evaluates
    once and ends; the platform's evals (`POST /v1/evals`) submit exactly this, and the runtime then builds
    `runtime.pipeline.evaluate.EvalPipeline`, which reads no training prompts and evaluates whatever
    `eval-interval` says."""
    return (
        spec.debug_rollout_only
        and not spec.is_sft
        and spec.num_rollout is not None
        and spec.start_rollout_id is not None
        and spec.start_rollout_id >= spec.num_rollout
        and bool(spec.eval_prompt_data or spec.eval_config)
    )
