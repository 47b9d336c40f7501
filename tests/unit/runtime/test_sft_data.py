"""SFT data: conversations (key map, system prompt, tools, multi-turn masks), eval-size, oversize strategies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.data.arith import SHAREGPT_KEY_MAP
from runtime.data.prompts import (
    DatasetConfig,
    PromptFormatter,
    PromptItem,
    read_prompt_items,
    split_eval_holdout,
)
from runtime.data.sft import OversizePolicy, OversizeStrategy, SFTExampleBuilder


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _chat_rows(tmp_path: Path) -> Path:
    row = {
        "conversations": [
            {"from": "human", "value": "1+2="},
            {"from": "gpt", "value": "\\boxed{3}"},
            {"from": "human", "value": "human gpt"},  # role words in text are never renamed
            {"from": "gpt", "value": "\\boxed{4}"},
        ],
        "tools": [{"type": "function", "function": {"name": "add"}}],
    }
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def test_conversation_key_map_multi_turn_mask_system_prompt_and_tools(tok, tmp_path: Path) -> None:
    config = DatasetConfig(
        input_key="conversations", conversation_key_map=SHAREGPT_KEY_MAP, system_prompt="Be brief."
    )
    (item,) = read_prompt_items(_chat_rows(tmp_path), config)
    assert item.prompt[2] == {"role": "user", "content": "human gpt"} and item.tools
    builder = SFTExampleBuilder(PromptFormatter(tok, config), label_key=None)
    sample = builder.build(item, 0)
    assert sample is not None
    text = tok.decode(sample.tokens)
    assert text.startswith(
        '<|im_start|>system\n# Tools\n[{"type": "function"'
    )  # tool-key reaches the template
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    # exactly the two assistant answers (with their end-of-turn) are trained
    mask = [0] * sample.prompt_length + sample.loss_mask  # type: ignore[operator]
    trained = [t for t, m in zip(sample.tokens, mask, strict=True) if m]
    assert tok.decode(trained) == "\\boxed{3}<|im_end|>\n\\boxed{4}<|im_end|>\n"
    assert sample.loss_mask[0] == 1 and 0 in sample.loss_mask  # type: ignore[index]
    prompt = builder.prediction_prompt(item)
    assert prompt.reference == "\\boxed{4}" and prompt.prompt_text.endswith(
        "human gpt<|im_end|>\n<|im_start|>assistant\n"
    )


def test_eval_size_holds_out_rows_once_with_the_seed() -> None:
    rows = [PromptItem(i, str(i), None, {}, {}) for i in range(20)]
    train, held = split_eval_holdout(rows, 0.25, seed=3)
    again, held_again = split_eval_holdout(rows, 0.25, seed=3)
    assert [p.index for p in held] == [p.index for p in held_again] and len(held) == 5
    assert not {p.index for p in train} & {p.index for p in held} and len(train) == 15
    assert len(split_eval_holdout(rows, 3, seed=0)[1]) == 3
    assert len(split_eval_holdout(rows, 100, seed=0)[0]) == 1  # one row always stays for training


def test_oversize_strategies(tok) -> None:
    config = DatasetConfig(label_key="output")
    item = PromptItem(0, "12+34=", "x", {}, {"input": "12+34=", "output": "\\boxed{46}"})
    formatter = PromptFormatter(tok, config)
    full = SFTExampleBuilder(formatter, label_key="output").build(item, 0)
    assert full is not None
    n, cap = len(full.tokens), len(full.tokens) - 3

    def build(strategy: OversizeStrategy, custom=None):
        policy = OversizePolicy(capacity=cap, strategy=strategy, custom=custom)
        return SFTExampleBuilder(formatter, label_key="output", oversize=policy).build(item, 0)

    assert build(OversizeStrategy.SKIP) is None
    assert build(OversizeStrategy.KEEP).tokens == full.tokens  # type: ignore[union-attr]
    left = build(OversizeStrategy.TRUNCATE_LEFT)
    assert left.tokens == full.tokens[-cap:] and left.response_tokens == full.response_tokens  # type: ignore[union-attr]
    right = build(OversizeStrategy.TRUNCATE_RIGHT)
    assert right.tokens == full.tokens[:cap] and right.response_length == full.response_length - 3  # type: ignore[union-attr]
    dropped = build(OversizeStrategy.CUSTOM, custom=lambda tokens, mask, capacity, idx: None)
    assert dropped is None
    halved = build(
        OversizeStrategy.CUSTOM, custom=lambda tokens, mask, capacity, idx: (tokens[: n // 2], [1] * (n // 2))
    )
    assert halved.prompt_length == 0 and halved.response_length == n // 2  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="custom"):
        build(OversizeStrategy.CUSTOM)
