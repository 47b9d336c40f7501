"""Elastic rollout's pure side (runtime/rollout/elastic.py): the autoscaler YAML (bounds, unknown keys
refused with a hint), the scale decisions step by step, the partial-success policy, and where
`--autoscaler-config` is refused (runtime/capabilities.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.capabilities import unsupported_parameters
from runtime.report_protocol import Grant
from runtime.roles.elastic import ElasticRollout, EngineHome
from runtime.roles.groups import RolloutGroup
from runtime.rollout.elastic import (
    Autoscaler,
    AutoscalerConfig,
    AutoscalerConfigError,
    ElasticSettings,
    PartialSuccessPolicy,
    settle_scale_out,
)

GOOD = {
    "min_engines": 1,
    "max_engines": 3,
    "scale_out": {"threshold": 0.5, "step": 2, "cooldown_steps": 1},
    "scale_in": {"threshold": 0.2, "cooldown_steps": 2},
}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**GOOD, "max_engine": 3}, r"unknown key 'max_engine' \(did you mean max_engines\?\)"),
        (
            {**GOOD, "scale_out": {"treshold": 0.5}},
            r"scale_out: unknown key 'treshold' \(did you mean threshold",
        ),
        ({"max_engines": 3}, "min_engines is required"),
        ({**GOOD, "min_engines": 4}, r"max_engines \(3\) must be >= min_engines \(4\)"),
        ({**GOOD, "min_engines": 0}, "min_engines must be an integer >= 1, got 0"),
        ({**GOOD, "max_engines": "3"}, "max_engines must be an integer >= 1, got '3'"),
        (
            {**GOOD, "scale_out": {"threshold": 1.5}},
            r"scale_out.threshold must be a share .* in \[0, 1\], got 1.5",
        ),
        ({**GOOD, "scale_in": {"threshold": 0.6}}, "scale_in.threshold .* must be below scale_out.threshold"),
        ({**GOOD, "scale_in": {"threshold": 0.1, "step": 0}}, "scale_in.step must be an integer >= 1"),
        ({**GOOD, "scale_out": 2}, "scale_out must be a mapping"),
        ([1, 2], "a mapping of keys is expected, got list"),
    ],
)
def test_a_wrong_autoscaler_config_is_refused_naming_the_key(data, message):
    with pytest.raises(AutoscalerConfigError, match=message):
        AutoscalerConfig.parse(data)


def test_the_settings_read_the_yaml_and_the_flags(tmp_path: Path):
    path = tmp_path / "autoscaler.yaml"
    path.write_text("min_engines: 1\nmax_engines: 3\nscale_out: {threshold: 0.5, step: 2}\n")
    assert ElasticSettings.from_values({"autoscaler_config": None, "scale_out_timeout": 9.0}) is None
    s = ElasticSettings.from_values(
        {
            "autoscaler_config": str(path),
            "scale_out_timeout": 9.0,
            "scale_out_partial_success_policy": "keep_partial",
            "scale_in_drain_timeout": 4.0,
            "scale_in_shutdown_timeout": 2.0,
        }
    )
    assert s is not None
    assert (s.autoscaler.max_engines, s.autoscaler.scale_out.step, s.autoscaler.scale_in.threshold) == (
        3,
        2,
        0.2,
    )
    assert (s.scale_out_timeout_s, s.partial_success, s.drain_timeout_s, s.shutdown_timeout_s) == (
        9.0,
        PartialSuccessPolicy.KEEP_PARTIAL,
        4.0,
        2.0,
    )
    with pytest.raises(ValueError, match="--scale-in-drain-timeout must be > 0"):
        ElasticSettings.from_values({"autoscaler_config": str(path), "scale_in_drain_timeout": 0.0})
    with pytest.raises(AutoscalerConfigError, match="cannot be read"):
        ElasticSettings.from_values({"autoscaler_config": str(tmp_path / "missing.yaml")})
    path.write_text("min_engines: [")
    with pytest.raises(AutoscalerConfigError, match="not YAML"):
        ElasticSettings.from_values({"autoscaler_config": str(path)})


def test_the_autoscaler_follows_the_rollouts_share_of_the_step_within_bounds_and_cooldowns():
    scaler = Autoscaler(AutoscalerConfig.parse(GOOD))
    assert scaler.target(0, 5, 0.3) == 3  # outside the bounds: back within them first
    assert scaler.target(0, 1, 0.9) == 3  # rollout-bound: +2 (step), up to max_engines
    scaler.scaled(0)
    assert scaler.target(1, 3, 0.9) == 3  # at max_engines
    assert scaler.target(1, 3, 0.1) == 3  # scale_in cooldown: 2 steps
    assert scaler.target(2, 3, 0.1) == 2
    scaler.scaled(2)
    assert scaler.target(3, 2, 0.3) == 2  # between the thresholds: nothing
    assert scaler.target(3, 2, 0.6) == 3  # scale_out cooldown: 1 step
    every_other = Autoscaler(AutoscalerConfig.parse({**GOOD, "evaluation_interval": 2}))
    assert every_other.target(0, 1, 0.9) == 1 and every_other.target(1, 1, 0.9) == 3


def test_on_the_platform_the_driver_asks_the_pass_for_what_the_thresholds_decide():
    # GOOD: 1..3 engines; scale_out above 0.5 by 2 (cooldown 1), scale_in below 0.2 by 1 (cooldown 2). The job's spec
    # asks for 1 engine: the pass grants no more before the driver asks
    scaler = Autoscaler(AutoscalerConfig.parse(GOOD), wish=1)
    assert scaler.ask(0, 1, 0.3) is None  # between the thresholds: nothing to ask
    assert scaler.ask(1, 1, 0.9) == {"step": 1, "engines": 3, "share": 0.9, "threshold": 0.5}  # +2, up to max
    assert scaler.wish == 3
    assert scaler.ask(2, 1, 0.9) is None  # not granted yet, still rollout-bound: the wish stands
    assert (
        scaler.ask(2, 3, 0.1) is None
    )  # granted; the engines wait, but within scale_in's cooldown (2 steps)
    assert scaler.ask(3, 3, 0.1) == {"step": 3, "engines": 2, "share": 0.1, "threshold": 0.2}
    # the pass took an engine back for another job (1 runs, 2 asked): rollout-bound there, +2 from 1 is 3
    assert scaler.ask(4, 1, 0.9) == {"step": 4, "engines": 3, "share": 0.9, "threshold": 0.5}
    assert scaler.ask(5, 2, 0.6) is None  # rollout-bound at 2 of the 3 asked: 2 + 2 = 3, asked already
    # the engines wait while the pass has not yet taken the surplus back: never a wish above the one asked
    high = Autoscaler(AutoscalerConfig.parse(GOOD), wish=1)
    assert high.ask(0, 3, 0.1) is None and high.wish == 1  # 3 - 1 = 2 > 1 asked: stays 1
    # outside the bounds (5 engines of at most 3): brought within them first, no threshold crossed
    assert Autoscaler(AutoscalerConfig.parse(GOOD)).ask(0, 5, 0.3) == {
        "step": 0,
        "engines": 3,
        "share": 0.3,
        "threshold": None,
    }
    assert Autoscaler(AutoscalerConfig.parse(GOOD), wish=7).wish == 3  # a spec's count out of range: clamped
    # evaluation_interval 2: only every other step decides
    every_other = Autoscaler(AutoscalerConfig.parse({**GOOD, "evaluation_interval": 2}), wish=1)
    assert every_other.ask(0, 1, 0.9) is None
    assert every_other.ask(1, 1, 0.9) == {"step": 1, "engines": 3, "share": 0.9, "threshold": 0.5}


def test_a_placed_driver_asks_for_engines_and_reports_the_grant_its_engines_match():
    """`ElasticRollout.after_step` on the platform: the wish goes to `report_wish`, and the grant's number to
    `report_followed` once the engines run only where the grant has replicas (then the pass frees the GPUs of
    those it took back). Engines that no step here starts or stops: no Ray."""
    wishes: list[dict] = []
    followed: list[int] = []
    grant = Grant(("a", "b"), 7)

    def no_start(index: int, node: str | None):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"no room on {node}")

    elastic = ElasticRollout(
        RolloutGroup([object(), object()]),  # type: ignore[list-item]
        no_start,
        ElasticSettings(AutoscalerConfig.parse(GOOD)),
        homes=[EngineHome("rollout-engine-0", "a"), EngineHome("rollout-engine-1", "b")],
        placed=True,
        base=2,
        follow=lambda: grant,
        report_wish=wishes.append,
        report_followed=followed.append,
    )
    metrics = elastic.after_step(0, rollout_s=9.0, step_s=10.0)  # rollout-bound: 2 + 2, at most 3
    assert wishes == [{"step": 0, "engines": 3, "share": 0.9, "threshold": 0.5}] and followed == [7]
    assert (metrics["rollout/wished_engines"], metrics["rollout/granted_engines"]) == (3.0, 2.0)
    elastic.after_step(1, rollout_s=4.0, step_s=10.0)
    assert len(wishes) == 1 and followed == [7]  # the same grant: said once
    grant = Grant(("b", "a"), 9)
    elastic.after_step(2, rollout_s=4.0, step_s=10.0)
    assert followed == [7, 9]  # the same nodes, a later grant
    # the grant moves the one engine to c, which cannot start: the engine on a still runs (never the last), so the
    # grant is not reported followed (the pass keeps holding what it took back)
    elastic.homes, elastic.group.actors = [EngineHome("rollout-engine-0", "a")], [object()]  # type: ignore[list-item]
    grant = Grant(("c",), 11)
    elastic.after_step(3, rollout_s=4.0, step_s=10.0)
    assert followed == [7, 9] and elastic.scale_out_failures == 1 and len(elastic.homes) == 1


def test_the_partial_success_policy_decides_which_new_engines_stay():
    assert settle_scale_out([True, False, True], PartialSuccessPolicy.ROLLBACK_ALL) == [False] * 3
    assert settle_scale_out([True, False, True], PartialSuccessPolicy.KEEP_PARTIAL) == [True, False, True]
    assert settle_scale_out([True, True], PartialSuccessPolicy.ROLLBACK_ALL) == [True, True]


@pytest.mark.parametrize(
    "values",
    [
        {"colocate": True},
        {"rollout_external": True, "rollout_external_engine_addrs": ["10.0.0.1:30000"]},
        {"use_health_check": True},
        {"fully_async": True},
    ],
)
def test_autoscaler_config_is_refused_where_it_cannot_scale_the_engines(values):
    job = {"train_backend": "torch", "autoscaler_config": "/x/autoscaler.yaml", "scale_out_timeout": 60.0}
    assert unsupported_parameters(job, {}) == []
    assert unsupported_parameters({**job, **values}, {}) == ["autoscaler_config='/x/autoscaler.yaml'"]
