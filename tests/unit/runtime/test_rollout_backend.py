"""The in-process rollout engine's backend (runtime/rollout/backend.py): HF unless RELAX_ROLLOUT_BACKEND
names fastgen, fastgen then giving HF's greedy tokens and taking the driver's weight versions as labels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runtime.devices import Device
from runtime.rollout.backend import BACKEND_ENV, in_process_engine, load_versioned_weights
from runtime.rollout.engine import SamplingParams, TorchRolloutEngine
from runtime.rollout.fastgen import FastGenEngine
from runtime.rollout.sglang.tensor_payload import read_hf_weights

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_in_process_engine_follows_the_backend_setting(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = Device.detect()
    for value in ("", "auto", "hf"):  # auto keeps HF in-process, on any device
        monkeypatch.setenv(BACKEND_ENV, value)
        assert isinstance(in_process_engine(str(tiny_model), device=device), TorchRolloutEngine)
    monkeypatch.setenv(BACKEND_ENV, "fastgen")
    fastgen = in_process_engine(str(tiny_model), device=device, max_batch_size=4)
    assert isinstance(fastgen, FastGenEngine)
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    hf = TorchRolloutEngine(str(tiny_model), device=device)
    want = hf.generate(PROMPTS, params)
    got = fastgen.generate(PROMPTS, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    for a, b in zip(got, want, strict=True):
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-4)


def test_versioned_weights_are_the_drivers_labels(tiny_model: Path) -> None:
    engine = FastGenEngine(str(tiny_model), device=Device.detect(), max_batch_size=4)
    weights = read_hf_weights(tiny_model)
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    for version in (0, 3, 3, 7):  # the initial push, a skip (update-weights-interval), a repeat
        load_versioned_weights(engine, weights, version)
        assert {r.weight_version for r in engine.generate(PROMPTS, params)} == {version}
    partial = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    with pytest.raises(KeyError, match=r"missing \['model.norm.weight'\]"):
        load_versioned_weights(engine, partial, 8)
    assert engine.weight_version == 7
    hf = TorchRolloutEngine(str(tiny_model), device=Device.detect())
    load_versioned_weights(hf, weights, 5)
    assert hf.weight_version == 5
