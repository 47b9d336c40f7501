"""Loss hooks by dotted path: the loader's contract and how policy_loss calls each hook."""

from __future__ import annotations

import itertools
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from runtime.algos.hooks import HookKind, load_hook
from runtime.algos.losses import LOSS_TYPES, LossConfig, LossInputs, resolve_loss_fn
from runtime.algos.off_policy import icepop_tis, vanilla_tis
from runtime.algos.reducers import sample_mean

_counter = itertools.count()

USER_CODE = """
import torch
from runtime.algos.off_policy import TISResult

def reject_all(*, pg_loss, train_log_probs, rollout_log_probs, loss_mask, clip_low, clip_high):
    return TISResult(pg_loss=pg_loss * 0 + 7.0, loss_mask=loss_mask * 0, metrics={"seen_clip": loss_mask * clip_high})

def total(values, loss_mask, *, per_token_loss):
    return (values * loss_mask).sum() + (100.0 if per_token_loss else 0.0)

def my_loss(inputs, config):
    loss = -(inputs.log_probs * inputs.loss_mask).sum()
    return loss, {"custom": loss.detach()}

def wrong(args, pg_loss):
    return pg_loss

not_callable = 3
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"user_hooks_{next(_counter)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    load_hook.cache_clear()


def _inputs() -> LossInputs:
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(2, 3, generator=gen)
    return LossInputs(
        log_probs=lp,
        entropy=torch.zeros(2, 3),
        loss_mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        old_log_probs=lp.clone(),
        rollout_log_probs=lp - 0.1,
        advantages=torch.tensor([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0]]),
    )


def test_load_hook_accepts_both_path_forms_and_relax_aliases(user_module: str) -> None:
    assert load_hook(HookKind.TIS, f"{user_module}.reject_all").__name__ == "reject_all"
    assert load_hook(HookKind.LOSS, f"{user_module}:my_loss").__name__ == "my_loss"
    assert load_hook(HookKind.TIS, "relax.backends.megatron.loss.vanilla_tis_function") is vanilla_tis
    assert load_hook(HookKind.TIS, "relax.backends.megatron.loss.icepop_function") is icepop_tis


def test_load_hook_refuses_wrong_signatures_by_path(user_module: str) -> None:
    with pytest.raises(TypeError, match=rf"custom-tis-function-path '{user_module}.wrong' cannot be called"):
        load_hook(HookKind.TIS, f"{user_module}.wrong")
    with pytest.raises(TypeError, match="cannot be called as fn\\(_, _, per_token_loss=\\)"):
        load_hook(HookKind.PG_LOSS_REDUCER, f"{user_module}.reject_all")
    with pytest.raises(TypeError, match="not callable"):
        load_hook(HookKind.LOSS, f"{user_module}.not_callable")
    with pytest.raises(ImportError):
        load_hook(HookKind.LOSS, f"{user_module}.missing")


def test_custom_tis_replaces_pg_and_its_mask_while_metrics_keep_the_original_mask(user_module: str) -> None:
    inputs = _inputs()
    config = LossConfig(use_tis=True, tis_clip=3.0, custom_tis_function_path=f"{user_module}.reject_all")
    _, metrics = LOSS_TYPES.get("policy_loss")(inputs, config)
    assert metrics["pg_loss"].item() == 0.0  # every token rejected: the reducer's mask is empty
    assert metrics["seen_clip"].item() == pytest.approx(3.0)  # reduced over the original mask


def test_custom_pg_reducer_applies_to_pg_loss_only(user_module: str) -> None:
    inputs = _inputs()
    path = f"{user_module}.total"
    _, metrics = LOSS_TYPES.get("policy_loss")(inputs, LossConfig(custom_pg_loss_reducer_function_path=path))
    assert metrics["pg_loss"].item() == pytest.approx(-(1.0 + 1.0 - 2.0))
    _, per_token = LOSS_TYPES.get("policy_loss")(
        inputs, LossConfig(custom_pg_loss_reducer_function_path=path, per_token_loss=True)
    )
    assert per_token["pg_loss"].item() == pytest.approx(100.0)
    assert metrics["entropy"].item() == sample_mean(inputs.entropy, inputs.loss_mask).item()


def test_custom_loss_type(user_module: str) -> None:
    fn = resolve_loss_fn("custom_loss", f"{user_module}.my_loss")
    loss, metrics = fn(_inputs(), LossConfig())
    assert metrics["custom"].item() == pytest.approx(loss.item())
