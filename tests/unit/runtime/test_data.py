"""Arithmetic datasets, prompt rendering, the data source and SFT examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.data.arith import ArithTask, write_datasets
from runtime.data.prompts import DatasetConfig, PromptCursor, PromptFormatter, read_prompt_items
from runtime.data.sft import SFTExampleBuilder


def test_write_datasets_is_deterministic(tmp_path: Path) -> None:
    a = write_datasets(tmp_path / "a", seed=3)
    b = write_datasets(tmp_path / "b", seed=3)
    c = write_datasets(tmp_path / "c", seed=4)
    assert set(a) == {"train", "test", "sft", "sft_chat"}
    for key in a:
        assert a[key].read_text() == b[key].read_text()
    assert a["train"].read_text() != c["train"].read_text()
    row = json.loads(a["train"].read_text().splitlines()[0])
    assert set(row) == {"input", "label", "metadata"}
    assert str(eval(row["input"].removesuffix("="))) == row["label"]
    sft = json.loads(a["sft"].read_text().splitlines()[0])
    assert sft["output"].startswith("\\boxed{")


def test_holdout_split_is_disjoint(tmp_path: Path) -> None:
    paths = write_datasets(tmp_path, seed=0, task=ArithTask(max_operand=9, ops=("+", "-")), test_fraction=0.2)
    train = {json.loads(line)["input"] for line in paths["train"].read_text().splitlines()}
    test = {json.loads(line)["input"] for line in paths["test"].read_text().splitlines()}
    assert train and test and not (train & test)


def test_formatter_system_prompt_and_chat_template(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    plain = PromptFormatter(tok, DatasetConfig(system_prompt="Be brief. "))
    assert plain.render("What is 1 + 1?") == "Be brief. What is 1 + 1?"
    chat = PromptFormatter(tok, DatasetConfig(apply_chat_template=True, system_prompt="Be brief."))
    text = chat.render("What is 1 + 1?")
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    assert chat.encode("What is 1 + 1?") == tok(text, add_special_tokens=False)["input_ids"]


def test_data_source_epochs_shuffle_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"input": f"q{i}", "label": str(i)}) + "\n" for i in range(5)))
    items = read_prompt_items(path, DatasetConfig(label_key="label"))
    source = PromptCursor(items, shuffle=True, seed=7)
    first = [p.index for p in source.next_prompts(3)]
    state = source.state_dict()
    rest = [p.index for p in source.next_prompts(4)]  # crosses into epoch 1
    assert sorted(first + rest[:2]) == list(range(5))
    assert source.state_dict()["epoch"] == 1
    resumed = PromptCursor(items, shuffle=True, seed=7)
    resumed.load_state_dict(state)
    assert [p.index for p in resumed.next_prompts(4)] == rest


def test_missing_input_key_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="'input'"):
        read_prompt_items(path, DatasetConfig())


def test_sft_example_masks_only_the_response(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    formatter = PromptFormatter(tok, DatasetConfig(label_key="output"))
    item = read_prompt_items_from_rows([{"input": "What is 2 + 3?", "output": "\\boxed{5}"}], "output")[0]
    sample = SFTExampleBuilder(formatter, label_key="output").build(item, 0)
    prompt_ids = tok("What is 2 + 3?", add_special_tokens=False)["input_ids"]
    assert sample.tokens[: len(prompt_ids)] == prompt_ids
    assert sample.response_tokens[-1] == tok.eos_token_id
    assert tok.decode(sample.response_tokens[:-1]) == "\\boxed{5}"
    # messages form with the chat template: the target is the assistant turn
    chat = PromptFormatter(tok, DatasetConfig(apply_chat_template=True))
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    item = read_prompt_items_from_rows([{"input": msgs}], None)[0]
    sample = SFTExampleBuilder(chat, label_key=None).build(item, 0)
    assert tok.decode(sample.response_tokens) == "hello<|im_end|>\n"


def read_prompt_items_from_rows(rows: list[dict], label_key: str | None):
    from runtime.data.prompts import PromptItem

    return [
        PromptItem(i, r["input"], r.get(label_key) if label_key else None, {}, r) for i, r in enumerate(rows)
    ]
