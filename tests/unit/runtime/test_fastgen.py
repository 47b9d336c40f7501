"""fastgen, the GPU rollout engine, on CPU with the tiny Qwen2: the same code as on CUDA except that decode
steps run eagerly (CUDA graphs are exercised through a fake that replays the captured function)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime.devices import Device, DeviceKind
from runtime.rollout.engine import TorchRolloutEngine
from runtime.rollout.fastgen import FastGenEngine
from runtime.rollout.fastgen.engine import batch_buckets
from runtime.rollout.params import FinishReason, SamplingParams

CPU = Device(DeviceKind.CPU)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threads only contend on a shared machine
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> FastGenEngine:
    return FastGenEngine(str(tiny_model), device=CPU, max_batch_size=8, window_quantum=16)


@pytest.fixture(scope="module")
def hf_model(tiny_model: Path):  # type: ignore[no-untyped-def]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (5, 17, 9, 30, 3)]


def hf_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:  # type: ignore[no-untyped-def]
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def same(a: list, b: list) -> bool:  # type: ignore[type-arg]
    """Same tokens and log-probs (to fp32 noise): a random tiny model's next token depends mostly on the
    current one, so tokens alone would hide a wrong attention context; the log-probs do not."""
    return len(a) == len(b) and all(
        x.token_ids == y.token_ids
        and max((abs(p - q) for p, q in zip(x.log_probs, y.log_probs, strict=True)), default=0.0) < 1e-5
        for x, y in zip(a, b, strict=True)
    )


def alone(
    engine: FastGenEngine, prompts: list[list[int]], params: SamplingParams, budgets: list[int]
) -> list:  # type: ignore[type-arg]
    return [engine.generate([p], params, [b])[0] for p, b in zip(prompts, budgets, strict=True)]


def test_greedy_matches_hf_generate(
    tiny_model: Path, engine: FastGenEngine, prompts: list[list[int]]
) -> None:
    reference = TorchRolloutEngine(str(tiny_model), device=CPU)
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    ours, theirs = engine.generate(prompts, params), reference.generate(prompts, params)
    for mine, hf in zip(ours, theirs, strict=True):
        assert mine.token_ids == hf.token_ids
        assert mine.finish_reason is hf.finish_reason
        assert max(abs(a - b) for a, b in zip(mine.log_probs, hf.log_probs, strict=True)) < 1e-4


def test_log_probs_match_an_hf_forward(engine: FastGenEngine, hf_model, prompts: list[list[int]]) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(temperature=0.7, max_new_tokens=16, seed=1)
    for prompt, result in zip(prompts, engine.generate(prompts, params), strict=True):
        assert len(result.log_probs) == len(result.token_ids) > 0
        expected = hf_log_probs(hf_model, prompt, result.token_ids, 0.7)
        assert max(abs(a - b) for a, b in zip(result.log_probs, expected, strict=True)) < 1e-4


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("attention", ["sdpa", "bmm", "sdpa_full", "flex"])
def test_continuous_batching_equals_each_request_alone(
    tiny_model: Path, engine: FastGenEngine, prompts: list[list[int]], attention: str
) -> None:
    """Two slots for five requests of different lengths and budgets: requests are admitted as others
    finish, the highest slot moves down (compaction), windows grow; each gets what it gets alone."""
    budgets = [3, 20, 7, 12, 16]
    batched_engine = FastGenEngine(
        str(tiny_model), device=CPU, max_batch_size=2, window_quantum=8, decode_attention=attention
    )
    batched = batched_engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=20), budgets)
    single = alone(engine, prompts, SamplingParams(temperature=0.0, max_new_tokens=20), budgets)
    assert same(batched, single)
    assert [len(r.token_ids) for r in batched] == budgets
    assert batched_engine.slots == 2
    if attention == "sdpa":
        wide = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=4, window_quantum=8)
        wide.generate(prompts[:4], SamplingParams(temperature=0.0, max_new_tokens=20), [2, 2, 2, 20])
        assert wide.stats.compactions >= 1  # the long request left slot 3 for slot 0


def test_samples_of_one_prompt_share_its_prefill_and_attention(
    tiny_model: Path,
    hf_model,
    prompts: list[list[int]],  # type: ignore[no-untyped-def]
) -> None:
    """GRPO's n samples per prompt: each distinct prompt is prefilled once (the others copy its cache
    rows) and decode reads the shared prefix once per group (cascade attention); the log-probs still
    match an HF forward, and equal those of the per-row attention path. A stop id ending one sample
    early leaves its group with a free slot: the sharing goes on for the rest."""
    group = [prompts[3]] * 4 + [prompts[1]] * 4  # 30 and 17 tokens
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    shared = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=8, window_quantum=16)
    per_row = FastGenEngine(
        str(tiny_model), device=CPU, max_batch_size=8, window_quantum=16, prefix_attention=False
    )
    results = shared.generate(group, params)
    assert shared.stats.prefill_tokens == 30 + 17 and shared.stats.shared_prefills == 6
    assert shared.stats.shared_steps == shared.stats.decode_steps > 0
    assert same(results, per_row.generate(group, params)) and per_row.stats.shared_steps == 0
    assert len({tuple(r.token_ids) for r in results}) > 2  # the samples differ
    for prompt, result in zip(group, results, strict=True):
        expected = hf_log_probs(hf_model, prompt, result.token_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(result.log_probs, expected, strict=True)) < 1e-4
    stopping = SamplingParams(
        temperature=1.0, max_new_tokens=10, seed=3, stop_token_ids=[results[1].token_ids[2]]
    )
    early = shared.generate(group, stopping)
    assert FinishReason.STOP in {r.finish_reason for r in early} and shared.stats.shared_steps > 0
    assert same(early, per_row.generate(group, stopping))


def test_blocked_sampler_draws_the_full_inverse_cdf_token() -> None:
    """The plain sampler reads the vocabulary by blocks; its token is the one a full-vocabulary
    inverse CDF draws with the same uniform number (greedy rows: the first maximum), and its log-prob
    is log softmax(logits / T) of that token."""
    from runtime.rollout.fastgen import sampler as fs

    gen = torch.Generator().manual_seed(0)
    b, v = 32, 1000  # 25 blocks of 40
    logits = torch.randn(b, v, generator=gen) * 4
    logits[:, 7] = logits[:, 900] = logits.max() + 1  # a tie: greedy takes the first
    state = fs.SlotState.allocate(b, 8, torch.device("cpu"))
    state.temperature[:] = torch.rand(b, generator=gen) + 0.3
    state.temperature[:4] = 0
    state.seed[:] = torch.randint(0, 2**31, (b,), generator=gen)
    for step in range(5):
        state.generated[:] = step
        token, log_prob = fs.sample(logits, state, fs.SamplerMode(), slice(0, b))
        scaled = logits / torch.where(state.temperature <= 0, 1.0, state.temperature)[:, None]
        cdf = torch.exp(scaled - scaled.amax(-1, keepdim=True)).cumsum(-1)
        u = fs.uniform(state.seed, state.generated)
        drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
        assert torch.equal(token, torch.where(state.temperature <= 0, scaled.argmax(-1), drawn))
        assert (token[:4] == 7).all()
        expected = torch.log_softmax(scaled, -1).gather(1, token[:, None]).squeeze(1)
        assert torch.allclose(log_prob, expected, atol=1e-5)


def test_sampling_from_block_stats_draws_what_the_sampler_draws() -> None:
    """The plain mode from per-block (max, first argmax, sum exp) stats (`triton_sampler`, here with its
    torch reference for the kernel): the same tokens as `sampler.sample` and the full-vocabulary inverse
    CDF, greedy rows the first maximum, the same log-probs."""
    from runtime.rollout.fastgen import sampler as fs
    from runtime.rollout.fastgen import triton_sampler as ts

    gen = torch.Generator().manual_seed(1)
    b, v = 64, 1000  # 25 blocks of 40
    logits = torch.randn(b, v, generator=gen) * 2
    logits[:4, 7] = logits[:4, 900] = logits.max() + 1  # a tie across blocks: greedy takes the first
    state = fs.SlotState.allocate(b, 8, torch.device("cpu"))
    state.temperature[:] = torch.rand(b, generator=gen) + 0.3
    state.temperature[:4] = 0
    state.seed[:] = torch.randint(0, 2**31, (b,), generator=gen)
    for step in range(5):
        state.generated[:] = step
        stats = ts.block_stats_reference(logits, state.temperature)
        token, log_prob = ts.sample_from_block_stats(logits, *stats, state, slice(0, b))
        want_token, want_log_prob = fs.sample(logits, state, fs.SamplerMode(), slice(0, b))
        assert torch.equal(token, want_token) and (token[:4] == 7).all()
        assert torch.allclose(log_prob, want_log_prob, atol=1e-5)
    assert len(set(token.tolist())) > 30  # the draws spread


def test_slots_freed_by_stop_tokens_are_reused_cleanly(
    tiny_model: Path, engine: FastGenEngine, prompts: list[list[int]]
) -> None:
    """A request that ends on a stop id is only known to have ended a step later (one step stays in
    flight); its slot goes to a waiting request, whose state must not be reset with the old one's."""
    free = engine.generate(prompts, GREEDY)
    stops = (free[0].token_ids[2], free[2].token_ids[3])
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=stops)
    narrow = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=2, window_quantum=8)
    batched = narrow.generate(prompts * 2, params)
    single = alone(engine, prompts * 2, params, [12] * 10)
    assert same(batched, single)
    assert [r.finish_reason for r in batched] == [r.finish_reason for r in single]
    assert FinishReason.STOP in {r.finish_reason for r in batched}


def test_chunked_prefill_of_a_long_prompt(
    tiny_model: Path, engine: FastGenEngine, prompts: list[list[int]]
) -> None:
    chunked = FastGenEngine(str(tiny_model), device=CPU, max_prefill_tokens=8)
    assert same(chunked.generate(prompts, GREEDY), engine.generate(prompts, GREEDY))


def test_stop_token_ids_and_min_new_tokens(engine: FastGenEngine, prompts: list[list[int]]) -> None:
    free = engine.generate(prompts[:1], GREEDY)[0].token_ids
    stop = free[4]
    cut = engine.generate(
        prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop,))
    )[0]
    first = free.index(stop)
    assert cut.token_ids == free[: first + 1] and cut.finish_reason is FinishReason.STOP
    late = engine.generate(
        prompts[:1],
        SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop,), min_new_tokens=first + 2),
    )[0]
    assert stop not in late.token_ids[: first + 2]
    assert len(late.token_ids) >= first + 2
    assert late.token_ids[: first + 1] != cut.token_ids  # the stop id was suppressed where it was argmax


def test_stop_strings_end_the_response_and_stay_in_it(
    engine: FastGenEngine, prompts: list[list[int]]
) -> None:
    tok = engine.tokenizer
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3, min_new_tokens=16)
    free = engine.generate(prompts[:3], params)
    text = tok.decode(free[0].token_ids)
    stop = text[6:8]
    stopped = engine.generate(prompts[:3], SamplingParams(**{**params.__dict__, "stop": (stop,)}))
    first = stopped[0]
    assert first.finish_reason is FinishReason.STOP
    assert stop in tok.decode(first.token_ids) and stop not in tok.decode(first.token_ids[:-1])
    assert first.token_ids == free[0].token_ids[: len(first.token_ids)]
    assert len(first.log_probs) == len(first.token_ids)
    for before, after in zip(free[1:], stopped[1:], strict=True):  # the others end at their own first match
        if stop in tok.decode(before.token_ids):
            assert after.finish_reason is FinishReason.STOP and stop in tok.decode(after.token_ids)
        else:
            assert after.token_ids == before.token_ids


def test_top_k_one_and_tiny_top_p_are_greedy(engine: FastGenEngine, prompts: list[list[int]]) -> None:
    greedy = [r.token_ids for r in engine.generate(prompts, GREEDY)]
    top_k = engine.generate(prompts, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=12, seed=5))
    top_p = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=12, seed=5))
    assert [r.token_ids for r in top_k] == greedy
    assert [r.token_ids for r in top_p] == greedy


def test_seeds_are_reproducible_whatever_the_batch(engine: FastGenEngine, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_new_tokens=12, seed=11)
    a, b = engine.generate(prompts, params), engine.generate(prompts, params)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    other = engine.generate(prompts, SamplingParams(**{**params.__dict__, "seed": 12}))
    assert [r.token_ids for r in a] != [r.token_ids for r in other]
    # the request-level API: one request's seed gives the same tokens alone or beside others
    rid = engine.submit(prompts[1], params, seed=99)
    crowd = [engine.submit(p, params, seed=i) for i, p in enumerate(prompts)]
    results = drain(engine)
    solo_rid = engine.submit(prompts[1], params, seed=99)
    solo = drain(engine)
    assert same([results[rid]], [solo[solo_rid]])
    assert len(crowd) == len(prompts)


def drain(engine: FastGenEngine) -> dict:  # type: ignore[type-arg]
    out = {}
    while engine.has_unfinished():
        out.update(dict(engine.step()))
    return out


def test_abort_returns_the_partial_response(engine: FastGenEngine, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    full = engine.generate(prompts[:2], params)
    keep, cut, waiting = (engine.submit(p, params) for p in (prompts[0], prompts[1], prompts[2]))
    results: dict = {}  # type: ignore[type-arg]
    for _ in range(6):
        results.update(dict(engine.step()))
    engine.abort(cut)
    results.update(drain(engine))
    assert results[keep].token_ids == full[0].token_ids
    partial = results[cut]
    assert partial.finish_reason is FinishReason.ABORT
    assert (
        0 < len(partial.token_ids) < 20 and partial.token_ids == full[1].token_ids[: len(partial.token_ids)]
    )
    assert len(partial.log_probs) == len(partial.token_ids)
    assert results[waiting].finish_reason is FinishReason.LENGTH
    # abort_all: everything in flight ends with what it has; queued requests end empty
    rids = [engine.submit(p, params) for p in prompts]
    engine.step()
    engine.abort_all()
    ended = drain(engine)
    assert {ended[r].finish_reason for r in rids} == {FinishReason.ABORT}
    assert not engine.has_unfinished()


def test_load_weights_in_place_and_its_refusals(tiny_model: Path, hf_model, prompts: list[list[int]]) -> None:  # type: ignore[no-untyped-def]
    fresh = FastGenEngine(str(tiny_model), device=CPU)
    before = [r.token_ids for r in fresh.generate(prompts, GREEDY)]
    flat = fresh.weights.flat
    state = {k: v.clone() for k, v in hf_model.state_dict().items()}
    gen = torch.Generator().manual_seed(7)
    changed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
    with pytest.raises(ValueError, match="expected 1"):
        fresh.load_weights(changed, version=2)
    missing = dict(changed)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        fresh.load_weights(missing, version=1)
    with pytest.raises(KeyError, match="model.layers.9.mlp.extra"):
        fresh.load_weights({**changed, "model.layers.9.mlp.extra": torch.zeros(1)}, version=1)
    bad = {**changed, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match="model.norm.weight"):
        fresh.load_weights(bad, version=1)
    assert [r.token_ids for r in fresh.generate(prompts, GREEDY)] == before  # nothing was half-loaded
    fresh.load_weights(changed, version=1)
    assert fresh.weights.flat.data_ptr() == flat.data_ptr()  # in place
    after = fresh.generate(prompts, GREEDY)
    assert [r.token_ids for r in after] != before and {r.weight_version for r in after} == {1}
    fresh.load_weights(state, version=2)
    assert [r.token_ids for r in fresh.generate(prompts, GREEDY)] == before


def test_bucketed_weight_update(tiny_model: Path, hf_model, prompts: list[list[int]]) -> None:  # type: ignore[no-untyped-def]
    fresh = FastGenEngine(str(tiny_model), device=CPU)
    state = {k: v + 0.01 for k, v in hf_model.state_dict().items()}
    names = sorted(state)
    with pytest.raises(RuntimeError, match="start_weight_update"):
        fresh.load_weight_bucket({names[0]: state[names[0]]})
    fresh.start_weight_update(1)
    fresh.load_weight_bucket({n: state[n] for n in names[:5]})
    with pytest.raises(ValueError, match="sent twice"):
        fresh.load_weight_bucket({names[0]: state[names[0]]})
    with pytest.raises(KeyError, match="missing"):
        fresh.finish_weight_update()
    assert fresh.weight_version == 0
    fresh.start_weight_update(1)
    for start in range(0, len(names), 7):
        fresh.load_weight_bucket({n: state[n] for n in names[start : start + 7]})
    fresh.finish_weight_update()
    whole = FastGenEngine(str(tiny_model), device=CPU)
    whole.load_weights(state, version=1)
    assert fresh.weight_version == 1 and same(
        fresh.generate(prompts, GREEDY), whole.generate(prompts, GREEDY)
    )


def test_abort_all_from_another_thread(tiny_model: Path, prompts: list[list[int]]) -> None:
    import threading
    import time

    engine = FastGenEngine(str(tiny_model), device=CPU)
    engine.abort_all()  # with nothing in flight: no effect on later requests
    out: list = []  # type: ignore[type-arg]
    params = SamplingParams(temperature=1.0, max_new_tokens=100_000, min_new_tokens=100_000, seed=0)
    worker = threading.Thread(target=lambda: out.extend(engine.generate(prompts, params)))
    worker.start()
    while engine.stats.decode_steps < 3:
        time.sleep(0.01)
    engine.abort_all()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert {r.finish_reason for r in out} == {FinishReason.ABORT}
    assert all(len(r.token_ids) >= 3 and len(r.log_probs) == len(r.token_ids) for r in out)


def test_offload_onload_round_trip(engine: FastGenEngine, prompts: list[list[int]]) -> None:
    before = [r.token_ids for r in engine.generate(prompts, GREEDY)]
    engine.offload()
    assert engine.kv is None and engine.weights.flat.untyped_storage().nbytes() == 0  # released, views kept
    with pytest.raises(RuntimeError, match="offloaded"):
        engine.generate(prompts, GREEDY)
    engine.onload()
    assert [r.token_ids for r in engine.generate(prompts, GREEDY)] == before


@pytest.mark.parametrize("rope", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}])  # fmt: skip
def test_llama_family_untied_head_and_rope_scaling(rope: dict | None) -> None:  # type: ignore[type-arg]
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=False, eos_token_id=None,
    )  # fmt: skip
    if rope is not None:
        config.rope_parameters = {"rope_theta": 500000.0, **rope}
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    engine = FastGenEngine.from_hf_model(model, device=CPU)
    assert not engine.cfg.attention_bias and "lm_head.weight" in engine.weights.hf
    prompts = [list(range(5, 45)), list(range(100, 107))]
    params = SamplingParams(temperature=0.8, max_new_tokens=40, seed=2)
    for prompt, result in zip(prompts, engine.generate(prompts, params), strict=True):
        expected = hf_log_probs(model, prompt, result.token_ids, 0.8)
        assert max(abs(a - b) for a, b in zip(result.log_probs, expected, strict=True)) < 1e-4


def test_zero_budgets_and_from_hf_model(hf_model, prompts: list[list[int]]) -> None:  # type: ignore[no-untyped-def]
    engine = FastGenEngine.from_hf_model(hf_model, device=CPU)
    results = engine.generate(prompts[:2], GREEDY, [0, 1])
    assert results[0].token_ids == [] and results[0].finish_reason is FinishReason.LENGTH
    assert len(results[1].token_ids) == 1


class FakeCudaGraphs:
    """Stands in for CUDA graphs on CPU (none exist here): `capture` records the function without running
    it, as a real capture does, and a replay calls it."""

    def __init__(self) -> None:
        self.captured = 0
        self.replays = 0

    def reset(self) -> None:
        pass

    def warm_up(self, fn):  # type: ignore[no-untyped-def]
        fn()

    def capture(self, fn):  # type: ignore[no-untyped-def]
        self.captured += 1

        def replay() -> None:
            self.replays += 1
            fn()

        return replay


def test_graph_capture_bookkeeping_with_fake_cuda_graphs(
    tiny_model: Path, engine: FastGenEngine, prompts: list[list[int]]
) -> None:
    graphed = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=4, window_quantum=16)
    fake = FakeCudaGraphs()
    graphed.graphs = fake  # type: ignore[assignment]
    params = SamplingParams(temperature=1.0, max_new_tokens=20, seed=4)
    budgets = [3, 20, 7, 12, 16]
    assert same(graphed.generate(prompts, params, budgets), engine.generate(prompts, params, budgets))
    assert fake.replays == graphed.stats.decode_steps
    assert 0 < fake.captured == graphed.stats.graph_captures < fake.replays  # (batch, window, mode) reused
    assert batch_buckets(512)[:8] == [1, 2, 4, 8, 16, 24, 32, 48] and batch_buckets(512)[-1] == 512


def test_gpu_rollout_bench_runs_tiny_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.gpu_rollout import main

    main(["--tiny", "--device", "cpu", "--attention", "sdpa,bmm", "--check-seqs", "2", "--new-tokens", "6"])
    out = capsys.readouterr().out
    assert "fastgen[sdpa,eager]" in out and "fastgen[bmm,eager]" in out and "hf generate" in out
    worst = [
        float(line.split("= ")[1].split(",")[0]) for line in out.splitlines() if line.startswith("log-prob")
    ]
    assert len(worst) == 2 and max(worst) < 1e-4


def test_compile_falls_back_to_eager_when_the_compiler_fails(
    tiny_model: Path, engine: FastGenEngine, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("no triton here")

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: broken)
    compiled = FastGenEngine(str(tiny_model), device=CPU, compile=True)
    assert same(compiled.generate(prompts, GREEDY), engine.generate(prompts, GREEDY))


TRITON_CHECK = """
import torch
from runtime.devices import Device, DeviceKind
from runtime.rollout.fastgen import FastGenEngine
from runtime.rollout.params import SamplingParams

torch.set_num_threads(1)
cpu = Device(DeviceKind.CPU)
gen = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (5, 17, 9, 30, 3)]
group = [prompts[3]] * 4 + [prompts[1]] * 4
params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
model = {model!r}
import os
os.environ["RELAX_FASTGEN_TRITON_SAMPLER"] = "0"  # the reference: torch's sampler
ref = FastGenEngine(model, device=cpu, max_batch_size=8, window_quantum=16, decode_attention="sdpa")
os.environ["RELAX_FASTGEN_TRITON_SAMPLER"] = "1"
assert ref._block_stats is None
from runtime.rollout.fastgen import triton_attention, triton_sampler
for fused, per, batch, work in ((0, 1, 8, group), (0, 1, 2, prompts), (1, 8, 8, group), (1, 8, 2, prompts)):
    triton_attention.CONFIG["fused"] = fused  # 0: the row kernel measured first; 1: the fused one
    triton_sampler.CONFIG.update(per=per, warps=8 if per > 1 else 4)
    got = FastGenEngine(model, device=cpu, max_batch_size=batch, window_quantum=8, decode_attention="triton")
    assert got._block_stats is not None
    a, b = ref.generate(work, params), got.generate(work, params)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    worst = max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x.log_probs, y.log_probs))
    assert worst < 1e-5, worst
    assert (got.stats.shared_steps > 0) == (work is group), got.stats.as_dict()

# the kernel alone against plain attention: rows to their own lengths, a prefix read per group (in chunks
# side by side, one of them partial) or, for a group of more than 128 query heads, per row
# the kernel measured before (fused 0) and the fused one with 1 or 2 KV heads per program, given the step's
# new keys and values to write (`new`) or finding them in the cache; 3 KV heads: a half-empty program
import math
from runtime.rollout.fastgen import triton_attention
from runtime.rollout.fastgen.triton_attention import decode_attention
S, T, D, G = 32, 300, 64, 7
cases = [(0, 1), (128, 8), (190, 4), (150, 16), (100, 32)]
variants = ((0, 1, False, 2, 5), (1, 1, True, 2, 5), (1, 2, True, 2, 5), (1, 2, False, 2, 2), (1, 2, True, 3, 2))
for fused, heads, write, H, n_cases in variants:  # the last: the first n_cases of `cases`
    triton_attention.CONFIG.update(fused=fused, heads=heads)
    cache = torch.randn(2, S, H, T, D, generator=gen)
    q = torch.randn(S, H * G + 2 * H, D, generator=gen)[:, : H * G].view(S, H, G, D)  # strided, as decode's
    for prefix, n in cases[:n_cases]:
        lengths = torch.randint(max(prefix, 1), T - 1, (S,), generator=gen)
        new = torch.randn(S, 2, H, D, generator=gen) if write else None
        run = cache.clone()
        got = decode_attention(q, run[0], run[1], lengths, scale=D**-0.5, prefix=prefix, group=n, new=new)
        want_cache = cache.clone()
        if write:
            want_cache[:, torch.arange(S), :, lengths] = new
        assert torch.equal(run, want_cache), (fused, heads, prefix, n)
        for b in range(S):
            first = b // n * n if prefix else b
            c = want_cache
            k = torch.cat([c[0, first, :, :prefix], c[0, b, :, prefix : int(lengths[b]) + 1]], dim=1)
            v = torch.cat([c[1, first, :, :prefix], c[1, b, :, prefix : int(lengths[b]) + 1]], dim=1)
            want = (torch.einsum("hgd,htd->hgt", q[b], k) * D**-0.5).softmax(-1) @ v
            assert float((got[b] - want).abs().max()) < 1e-5, (fused, heads, H, prefix, n, b)
triton_attention.CONFIG.update(fused=0, heads=1)

# the sampler's kernel against its torch reference (151,936 ids: 128 blocks of 1,187)
from runtime.rollout.fastgen import triton_sampler as ts
logits = (torch.randn(6, 151936, generator=gen) * 3).to(torch.bfloat16)
logits[0, 5] = logits[0, 150000] = 30.0  # a tie across blocks: the first
temperature = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.0, 2.0])
want = ts.block_stats_reference(logits, temperature)
for per in (1, 8, 16):  # blocks per program (1: the kernel measured first)
    ts.CONFIG["per"] = per
    got = ts.block_stats(logits, temperature)
    assert torch.equal(got[1], want[1]) and int(got[1][0, 0]) == 5 and int(got[1][0, -2]) == 150000, per
    assert torch.allclose(got[0], want[0]) and torch.allclose(got[2], want[2], rtol=1e-5), per
small = torch.randn(3, 1000, generator=gen)  # 25 blocks of 40: the second program of 16 holds 9
got, want = ts.block_stats(small, temperature[:3]), ts.block_stats_reference(small, temperature[:3])
assert got[0].shape == (3, 25) and torch.equal(got[1], want[1]) and torch.allclose(got[2], want[2], rtol=1e-5)
print("ok")
"""


def test_triton_decode_attention_matches_sdpa_under_the_interpreter(tiny_model: Path) -> None:
    """`decode_attention="triton"` (the CUDA kernels, run by triton's CPU interpreter) against the default
    path: shared-prefix groups (the prefix read once per group) and continuous batching of ragged requests
    in two slots (with the sampler's kernel, against torch's sampler); then the attention kernels alone
    against plain attention, and the sampler's against its torch reference. Skipped where triton is not
    installed."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when the kernel is decorated: a fresh process
    done = subprocess.run(
        [sys.executable, "-c", TRITON_CHECK.format(model=str(tiny_model))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_triton_decode_attention_is_refused_where_it_cannot_run(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.rollout.fastgen import triton_attention, triton_sampler

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="triton"):
        FastGenEngine(str(tiny_model), device=CPU, decode_attention="triton")
    # what the kernels take (the engine's CUDA default falls back to sdpa / torch's sampler otherwise)
    assert (
        triton_attention.supports(64) and triton_attention.supports(128) and not triton_attention.supports(80)
    )
    assert triton_sampler.supports(151936) and triton_sampler.supports(128256)
    assert not triton_sampler.supports(151937)  # a prime: one block of the whole vocabulary


def test_the_garbage_collector_is_paused_while_a_batch_decodes_and_runs_again_after(
    engine: FastGenEngine, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`generate` pauses Python's cyclic collector for its decode loop (a collection there would stall every
    decode step waiting on the GPU) and restores it, also when the loop fails; `RELAX_FASTGEN_GC=1` leaves it
    running; a collector the caller had disabled stays disabled."""
    import gc

    from runtime.rollout.fastgen import engine as fastgen_engine

    seen: list[bool] = []
    step = engine.step

    def observed_step():  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return step()

    monkeypatch.setattr(engine, "step", observed_step)
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    assert gc.isenabled()
    engine.generate(prompts[:2], params)
    assert seen and not any(seen) and gc.isenabled()

    seen.clear()
    monkeypatch.setenv("RELAX_FASTGEN_GC", "1")
    engine.generate(prompts[:2], params)
    assert seen and all(seen) and gc.isenabled()
    monkeypatch.delenv("RELAX_FASTGEN_GC")

    with pytest.raises(RuntimeError, match="boom"), fastgen_engine.paused_collector():
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with fastgen_engine.paused_collector():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def run_steps(
    engine: FastGenEngine, work: list[tuple[list[int], SamplingParams, int]], aborts: dict[int, list[int]]
) -> dict[int, tuple[list[int], list[float], FinishReason]]:
    """Submit `work` (prompt, params, seed) then step until done, aborting the requests (indices into `work`;
    -1: abort_all) listed under a step number; every step leaves at most `pipeline_depth` steps in flight."""
    rids = [engine.submit(prompt, params, seed=seed) for prompt, params, seed in work]
    out: dict[int, tuple[list[int], list[float], FinishReason]] = {}
    steps = 0
    while engine.has_unfinished():
        for index in aborts.get(steps, []):
            engine.abort_all() if index < 0 else engine.abort(rids[index])
        for rid, result in engine.step():
            out[rids.index(rid)] = (result.token_ids, result.log_probs, result.finish_reason)
        assert len(engine._inflight) <= engine.pipeline_depth
        steps += 1
    return out


def test_a_deeper_pipeline_gives_the_results_of_depth_one(tiny_model: Path, prompts: list[list[int]]) -> None:
    """Two or three decode steps in flight instead of one: the same tokens, log-probs (to rounding: a slot
    freed later shifts admissions and compactions) and finish reasons, with stop ids (one request's stop id
    drawn by another, which goes on), stop strings, budgets, samples sharing a prefix, continuous batching in
    four slots; and with aborts mid-batch (a running request, a waiting one, abort_all): an aborted request
    ends with every token launched before its abort, whatever the depth."""
    reference = FastGenEngine(str(tiny_model), device=CPU, max_batch_size=16, window_quantum=8)
    free = reference.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=2))
    stop_id = free[1].token_ids[5]
    stop_text = reference.tokenizer.decode(free[3].token_ids)[3:5]
    base = SamplingParams(temperature=1.0, max_new_tokens=16, seed=2)
    kinds = [
        base,
        SamplingParams(**{**base.__dict__, "stop_token_ids": (stop_id,)}),
        SamplingParams(**{**base.__dict__, "max_new_tokens": 7}),
        SamplingParams(**{**base.__dict__, "stop": (stop_text,)}),
    ]
    work = [(prompt, kinds[i % 4], i) for i, prompt in enumerate(prompts * 3)]
    work += [(prompts[3], base, 100 + i) for i in range(4)]  # four samples of one prompt
    results = {}
    for depth in (1, 2, 3):
        engine = FastGenEngine(
            str(tiny_model), device=CPU, max_batch_size=4, window_quantum=8, pipeline_depth=depth
        )
        results[depth] = run_steps(engine, work, {})
        assert engine.stats.compactions > 0 and engine.stats.shared_prefills > 0
        assert len(engine._buffers) <= depth + 2  # host buffers are reused, not one per step
    one = results[1]
    reasons = [one[i][2] for i in range(len(work))]
    assert (
        FinishReason.STOP in reasons[1::4] and FinishReason.STOP in reasons[3::4]
    )  # a stop id, a stop string
    assert {len(one[i][0]) for i in range(2, 15, 4)} == {7}
    others = [i for i in range(len(work)) if work[i][1].stop_token_ids == () and not work[i][1].stop]
    assert any(stop_id in one[i][0][:-1] for i in others)  # another's stop id did not end this one
    for depth in (2, 3):
        assert [results[depth][i][0] for i in range(len(work))] == [one[i][0] for i in range(len(work))]
        assert [results[depth][i][2] for i in range(len(work))] == reasons
        worst = max(
            abs(p - q) for i in range(len(work)) for p, q in zip(results[depth][i][1], one[i][1], strict=True)
        )
        assert worst < 1e-5

    # aborts: requests 0 and 1 running, 6 still waiting, then abort_all (no stop ids: the same schedule)
    plain = [(prompt, base, i) for i, prompt in enumerate(prompts * 2)]
    aborted = {}
    for depth in (1, 2, 3):
        engine = FastGenEngine(
            str(tiny_model),
            device=CPU,
            max_batch_size=4,
            window_quantum=8,
            pipeline_depth=depth,
            eos_token_ids=(),
        )
        aborted[depth] = run_steps(engine, plain, {3: [0, 6], 5: [1], 20: [-1]})
        assert not engine.has_unfinished() and not engine._aborting
    first = aborted[1]
    assert first[0][2] is first[1][2] is first[6][2] is FinishReason.ABORT and first[6][0] == []
    assert 0 < len(first[0][0]) < len(first[1][0]) < 16
    assert FinishReason.ABORT in {first[i][2] for i in range(7, 10)}  # abort_all caught the last ones
    assert FinishReason.LENGTH in {first[i][2] for i in range(2, 6)}
    assert aborted[2] == first and aborted[3] == first


def test_pipeline_depth_defaults_and_environment_override(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELAX_FASTGEN_DEPTH", raising=False)
    assert FastGenEngine(str(tiny_model), device=CPU).pipeline_depth == 1  # CPU: decode runs eagerly
    monkeypatch.setenv("RELAX_FASTGEN_DEPTH", "3")
    assert FastGenEngine(str(tiny_model), device=CPU).pipeline_depth == 3
    assert FastGenEngine(str(tiny_model), device=CPU, pipeline_depth=2).pipeline_depth == 2
    with pytest.raises(ValueError, match="pipeline_depth"):
        FastGenEngine(str(tiny_model), device=CPU, pipeline_depth=0)
