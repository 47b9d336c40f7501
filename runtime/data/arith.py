"""The arithmetic task: deterministic RL prompt sets and an SFT corpus, written as JSONL datasets."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# File names inside the output folder of `write_datasets`; the examples refer to them.
TRAIN_FILE = "train.jsonl"  # RL prompts: {"input", "label", "metadata"}
TEST_FILE = "test.jsonl"  # held-out RL prompts, same schema, for eval
SFT_FILE = "sft.jsonl"  # SFT pairs: {"input", "output"} where output is the boxed answer
# SFT conversations, ShareGPT-style ({"conversations": [{"from": "human"|"gpt", "value"}], "tools"}): two
# problems per conversation, so the second answer is learned in the context of the first turn
SFT_CHAT_FILE = "sft_chat.jsonl"
SHAREGPT_KEY_MAP = {"from": "role", "value": "content", "human": "user", "gpt": "assistant"}
CALCULATOR_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"a": "int", "b": "int"}}}


@dataclass(frozen=True)
class ArithProblem:
    a: int
    op: str
    b: int

    @property
    def question(self) -> str:
        # Compact on purpose: every token costs training time on 2 CPU cores.
        return f"{self.a}{self.op}{self.b}="

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def target(self) -> str:
        """The response the task asks for; the `math` reward grades the boxed number."""
        return f"\\boxed{{{self.answer}}}"


@dataclass(frozen=True)
class ArithTask:
    """Which problems exist. Every (a, op, b) with operands in [0, max_operand] is one problem;
    subtraction keeps a >= b so answers stay non-negative."""

    max_operand: int = 9
    ops: tuple[str, ...] = ("+",)

    def all_problems(self) -> list[ArithProblem]:
        return [
            ArithProblem(a, op, b)
            for op in self.ops
            for a in range(self.max_operand + 1)
            for b in range(self.max_operand + 1)
            if op == "+" or a >= b
        ]

    def split(self, *, seed: int, test_fraction: float) -> tuple[list[ArithProblem], list[ArithProblem]]:
        problems = self.all_problems()
        random.Random(seed).shuffle(problems)
        n_test = int(round(len(problems) * test_fraction))
        return problems[n_test:], problems[:n_test]


def rl_record(problem: ArithProblem) -> dict:
    return {
        "input": problem.question,
        "label": str(problem.answer),
        "metadata": {"a": problem.a, "op": problem.op, "b": problem.b},
    }


def sft_record(problem: ArithProblem) -> dict:
    return {"input": problem.question, "output": problem.target}


def sft_chat_record(first: ArithProblem, second: ArithProblem, *, with_tool: bool) -> dict:
    record: dict = {
        "conversations": [
            {"from": "human", "value": first.question},
            {"from": "gpt", "value": first.target},
            {"from": "human", "value": second.question},
            {"from": "gpt", "value": second.target},
        ]
    }
    if with_tool:
        record["tools"] = [CALCULATOR_TOOL]
    return record


def tokenizer_corpus(task: ArithTask | None = None) -> list[str]:
    """Text the tiny tokenizer is trained on: questions and targets, each also on its own (prompt and
    response are tokenized apart, so "\\boxed" must merge without a leading space); digits are always
    split one per token by the pre-tokenizer."""
    task = task or ArithTask(max_operand=99, ops=("+", "-"))
    problems = task.all_problems()[:2000]
    return (
        [p.question for p in problems]
        + [p.target for p in problems]
        + [f"{p.question} {p.target}" for p in problems]
    )


def write_jsonl(path: Path, records: Iterable[dict]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def write_datasets(
    out_dir: str | Path,
    *,
    seed: int = 0,
    task: ArithTask | None = None,
    test_fraction: float = 0.0,
    train_repeats: int = 1,
) -> dict[str, Path]:
    """Write the arithmetic datasets to `out_dir` and return {"train", "test", "sft"} -> path.

    The same seed always yields the same files. `test_fraction` holds problems out of train and sft
    (0 keeps every problem in train and writes the whole task to test, for in-distribution eval);
    `train_repeats` repeats each train problem so one epoch lasts longer.
    """
    task = task or ArithTask()
    out = Path(out_dir)
    train, test = task.split(seed=seed, test_fraction=test_fraction)
    if not test:
        test = sorted(train, key=lambda p: (p.op, p.a, p.b))
    rng = random.Random(seed + 1)
    train_rows = [p for _ in range(train_repeats) for p in train]
    rng.shuffle(train_rows)
    sft_rows = list(train)
    rng.shuffle(sft_rows)
    paths = {
        "train": out / TRAIN_FILE,
        "test": out / TEST_FILE,
        "sft": out / SFT_FILE,
        "sft_chat": out / SFT_CHAT_FILE,
    }
    write_jsonl(paths["train"], map(rl_record, train_rows))
    write_jsonl(paths["test"], map(rl_record, test))
    write_jsonl(paths["sft"], map(sft_record, sft_rows))
    pairs = zip(sft_rows, sft_rows[1:] + sft_rows[:1], strict=True)
    write_jsonl(
        paths["sft_chat"],
        (sft_chat_record(a, b, with_tool=i % 4 == 0) for i, (a, b) in enumerate(pairs)),
    )
    return paths
