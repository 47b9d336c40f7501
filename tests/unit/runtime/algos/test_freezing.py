"""`only-train-params-name-list` / `freeze-params-name-list`: which parameters train."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.algos.freezing import apply_parameter_selection, select_trainable_parameters

NAMES = [
    "embedding.word_embeddings.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.1.mlp.experts.linear_fc2.weight",
    "output_layer.weight",
]


def test_no_lists_trains_everything() -> None:
    sel = select_trainable_parameters(NAMES)
    assert sel.trainable == tuple(NAMES) and sel.frozen == () and sel.unmatched_patterns == ()


def test_only_train_keeps_the_matches() -> None:
    sel = select_trainable_parameters(NAMES, only_train=["experts", "nope"])
    assert sel.trainable == (NAMES[1], NAMES[3])
    assert sel.frozen == (NAMES[0], NAMES[2], NAMES[4])
    assert sel.unmatched_patterns == ("nope",)


def test_freeze_drops_the_matches_with_search_semantics() -> None:
    sel = select_trainable_parameters(NAMES, freeze=["embedding", r"^output_layer\."])
    assert sel.frozen == (NAMES[0], NAMES[4])
    assert sel.trainable == tuple(NAMES[1:4])


def test_refusals() -> None:
    with pytest.raises(ValueError, match="cannot be used together"):
        select_trainable_parameters(NAMES, only_train=["a"], freeze=["b"])
    with pytest.raises(ValueError, match="not a valid regular expression"):
        select_trainable_parameters(NAMES, freeze=["("])
    with pytest.raises(ValueError, match="leaves no parameter"):
        select_trainable_parameters(NAMES, only_train=["lm_head"])
    with pytest.raises(ValueError, match="leaves no parameter"):
        select_trainable_parameters(NAMES, freeze=["."])


def test_apply_sets_requires_grad() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    sel = select_trainable_parameters([n for n, _ in model.named_parameters()], freeze=[r"^0\."])
    apply_parameter_selection(model.named_parameters(), sel)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == {
        "0.weight": False,
        "0.bias": False,
        "1.weight": True,
        "1.bias": True,
    }


@settings(max_examples=15, deadline=None, database=None)
@given(
    names=st.lists(
        st.from_regex(r"[a-z]{1,3}(\.[a-z0-9]{1,3}){0,2}", fullmatch=True),
        min_size=1,
        max_size=8,
        unique=True,
    ),
    pattern=st.from_regex(r"[a-z]{1,2}", fullmatch=True),
)
def test_selection_partitions_the_names_and_freeze_complements_only_train(
    names: list[str], pattern: str
) -> None:
    matched = [n for n in names if pattern in n]
    for kind in ("only_train", "freeze"):
        trains = matched if kind == "only_train" else [n for n in names if n not in matched]
        if not trains:
            with pytest.raises(ValueError):
                select_trainable_parameters(names, **{kind: [pattern]})
            continue
        sel = select_trainable_parameters(names, **{kind: [pattern]})
        assert list(sel.trainable) == trains
        assert sorted(sel.trainable + sel.frozen) == sorted(names)
        assert set(sel.trainable).isdisjoint(sel.frozen)
