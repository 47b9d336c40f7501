"""Eval aggregation (pass@k against a naive reference), eval-config resolution, perplexity, predictions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.eval import (
    eval_metrics,
    load_eval_datasets,
    naive_pass_at_k,
    pass_at_k,
    pass_rates,
    perplexity_metrics,
    read_eval_config,
    write_predictions,
)
from runtime.spec import RuntimeSpec
from runtime.types import Sample, SampleStatus
from tests.unit.runtime.fakes import CharTokenizer


@given(st.lists(st.booleans(), min_size=1, max_size=8), st.integers(min_value=1, max_value=8))
def test_pass_at_k_matches_enumerating_every_subset(correct: list[bool], k: int) -> None:
    k = min(k, len(correct))
    assert math.isclose(pass_at_k(len(correct), sum(correct), k), naive_pass_at_k(correct, k), abs_tol=1e-12)


def test_pass_rates_use_powers_of_two_and_exact_ones() -> None:
    groups = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.5, 1.0]]  # 0.5 is not a pass
    rates = pass_rates(groups)
    assert set(rates) == {"pass@1", "pass@2", "pass@4"}
    assert rates["pass@1"] == pytest.approx((0.25 + 0 + 0.75) / 3)
    assert rates["pass@4"] == pytest.approx(2 / 3)
    assert pass_rates([[1.0], [0.0]]) == {}


def test_eval_metrics_names() -> None:
    samples = [
        Sample(i, i // 2, "p", reward=float(i % 2), response_length=3 + i,
               status=SampleStatus.TRUNCATED if i == 0 else SampleStatus.COMPLETED)
        for i in range(4)
    ]  # fmt: skip
    m = eval_metrics("gsm", samples, log_passrate=True)
    assert m["eval/gsm"] == 0.5 and m["eval/gsm-truncated_ratio"] == 0.25
    assert m["eval/gsm/response_len"] == 4.5
    assert m["eval/gsm-pass@1"] == 0.5 and m["eval/gsm-pass@2"] == 1.0
    assert "eval/gsm-pass@1" not in eval_metrics("gsm", samples, log_passrate=False)


def test_eval_config_resolution_order(tmp_path: Path) -> None:
    data = tmp_path / "sets"
    data.mkdir()
    (data / "a.jsonl").write_text(
        json.dumps({"q": "1+1=", "ans": "2", "long": "x" * 50})
        + "\n"
        + json.dumps({"q": "2+2=" * 30, "ans": "4"})
        + "\n"
    )
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n"
        "  defaults:\n    n_samples_per_eval_prompt: 4\n    temperature: 0.7\n    input_key: q\n"
        "  datasets:\n"
        "    - name: a\n      path: sets/a.jsonl\n      label_key: ans\n      rm_type: math\n      max_prompt_len: 10\n"
        "    - name: b\n      path: sets/a.jsonl\n      n_samples_per_eval_prompt: 1\n      top_k: 5\n"
        "      metadata_overrides: {source: b}\n"
    )
    entries, defaults = read_eval_config(config)
    assert entries[0]["path"] == str(data / "a.jsonl") and defaults["temperature"] == 0.7
    spec = RuntimeSpec(
        eval_config=str(config),
        eval_top_p=0.9,
        rollout_top_k=3,
        eval_max_response_len=16,
        rollout_stop=["\n"],
    )
    a, b = load_eval_datasets(spec, CharTokenizer())
    assert (a.name, a.n_samples, a.temperature, a.top_p, a.top_k, a.max_response_len) == (
        "a",
        4,
        0.7,
        0.9,
        3,
        16,
    )
    assert len(a.items) == 1 and a.items[0].label == "2"  # the long prompt is over max_prompt_len
    assert a.metadata(a.items[0])["rm_type"] == "math" and a.stop == ("\n",)
    assert (b.n_samples, b.top_k, b.metadata(b.items[0])["source"]) == (1, 5, "b")
    # eval-prompt-data pairs, no config: the spec's eval-* then rollout-* settings
    spec = RuntimeSpec(
        eval_prompt_data=["x", str(data / "a.jsonl")], eval_input_key="q", n_samples_per_eval_prompt=2
    )
    (x,) = load_eval_datasets(spec, CharTokenizer())
    assert (x.name, x.n_samples, x.temperature) == ("x", 2, 1.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval:\n  datasets:\n    - name: z\n      path: a.jsonl\n      colour: red\n")
    with pytest.raises(ValueError, match="colour"):
        read_eval_config(bad)


def test_perplexity_and_predictions_file(tmp_path: Path) -> None:
    m = perplexity_metrics(2.0 * 10, 10)
    assert m == {"eval/loss": 2.0, "eval/ppl": pytest.approx(math.exp(2.0)), "eval/num_tokens": 10.0}
    path = write_predictions(tmp_path, 7, [{"prompt": "p", "reference": "r", "completion": "c"}])
    assert path == tmp_path / "predict" / "predictions_step_7.jsonl"
    assert json.loads(path.read_text()) == {"prompt": "p", "reference": "r", "completion": "c"}
