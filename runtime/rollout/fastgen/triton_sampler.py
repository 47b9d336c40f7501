"""The plain sampler's full-vocabulary pass as one Triton kernel over (row, vocabulary block) programs.

`sampler.sample` draws by inverse CDF in two levels (vocabulary blocks, then one block) and needs two
full-vocabulary reductions: the row maximum, then each block's mass sum(exp(x - max)). Compiled by inductor
each is one program per row walking 151,936 entries (~125 us each for 512 rows on an H100, ~1.2 TB/s).
Here one kernel reads the logits once with a program per (row, blocks): each block's maximum m_j, the
first index holding it, and s_j = sum(exp(x - m_j)) (x = logits / T in fp32). Then
`sample_from_block_stats` (small [B, blocks] tensors, plus one block of the logits) gives the row maximum
M = max_j m_j, the greedy token (the first maximum, as `argmax`), the block masses s_j * exp(m_j - M), and
draws as `sampler` does: the same token as the full-vocabulary inverse CDF from the same uniform number, up
to rounding, and the log-prob under softmax(logits / T). Only the plain mode (no top-k, top-p or suppressed
stop ids). A program takes `CONFIG["per"]` consecutive blocks as one [per, 2,048] tile. A program per (row,
block) (`per=1`) took 191 us for 512 rows on an H100 (65,536 programs of 1,187 entries, latency-bound against the
~50 us its bytes need); `bench/gpu_fastgen_kernels.py` there (2026-12-06): 180.7 us at per=1, 141.7 us at the
default per=2 (4 warps).

`block_stats_reference` is the same pass in torch (the CPU, and the tests' reference for the kernel).
"""

from __future__ import annotations

import os

import torch

from runtime.rollout.fastgen.sampler import SlotState, uniform, vocab_blocks

try:  # triton ships with torch's CUDA wheels; absent on CPU-only hosts
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is missing
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]


def available(device: torch.device) -> bool:
    """On CUDA with triton (`RELAX_FASTGEN_TRITON_SAMPLER=0` turns it off); on the CPU only under triton's
    interpreter (`TRITON_INTERPRET=1`, for tests)."""
    if triton is None or os.environ.get("RELAX_FASTGEN_TRITON_SAMPLER", "1") == "0":
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def supports(vocab: int) -> bool:
    """A vocabulary block is one program's load: up to 8,192 ids (151,936 = 128 blocks of 1,187)."""
    return vocab // vocab_blocks(vocab) <= 8192


if triton is not None:

    @triton.jit
    def _block_stats_kernel(
        Logits, Temperature, Peaks, Argmaxes, Sums,
        stride_row, blocks, width,
        W_PAD: tl.constexpr, PER: tl.constexpr,
    ):  # fmt: skip
        """One (row, PER consecutive vocabulary blocks) as a [PER, W_PAD] tile: each block's stats."""
        row = tl.program_id(0).to(tl.int64)
        block = tl.program_id(1) * PER + tl.arange(0, PER)  # [PER]
        temperature = tl.load(Temperature + row)
        scale = tl.where(temperature <= 0, 1.0, temperature)
        cols = tl.arange(0, W_PAD)
        real = block < blocks
        inside = real[:, None] & (cols[None, :] < width)
        first = block * width
        x = tl.load(
            Logits + row * stride_row + first[:, None] + cols[None, :], mask=inside, other=float("-inf")
        )
        x = x.to(tl.float32) / scale
        peak = tl.max(x, axis=1)
        where = tl.argmax(x, axis=1)  # the first maximum
        total = tl.sum(tl.where(inside, tl.exp(x - peak[:, None]), 0.0), axis=1)
        at = row * blocks + block
        tl.store(Peaks + at, peak, mask=real)
        tl.store(Argmaxes + at, first + where, mask=real)
        tl.store(Sums + at, total, mask=real)


# launch parameters; RELAX_FASTGEN_TRITON_SAMPLER_<NAME> overrides one: `per` vocabulary blocks per program
# (a power of two), `warps` triton's num_warps. The defaults, PER=2 WARPS=4, were the fastest of
# bench/gpu_fastgen_kernels.py's settings on an H100 (141.7 us for 512 rows; PER=1, the first launch, 180.7 us)
CONFIG = {
    name: int(os.environ.get(f"RELAX_FASTGEN_TRITON_SAMPLER_{name.upper()}", default))
    for name, default in (("per", 2), ("warps", 4))
}


def block_stats(
    logits: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, V] (unit stride over V), temperature [B] (<= 0: greedy, scale 1) -> per vocabulary block
    (`sampler.vocab_blocks(V)` of them) of x = logits / T in fp32: (max [B, n] fp32, the first index
    holding it [B, n] int64, sum(exp(x - max)) [B, n] fp32)."""
    b, v = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("block_stats needs logits with unit stride over the vocabulary")
    n = vocab_blocks(v)
    width = v // n
    per = min(triton.next_power_of_2(max(1, CONFIG["per"])), triton.next_power_of_2(n))
    peaks = torch.empty((b, n), dtype=torch.float32, device=logits.device)
    sums = torch.empty_like(peaks)
    argmaxes = torch.empty((b, n), dtype=torch.int64, device=logits.device)
    _block_stats_kernel[(b, -(-n // per))](
        logits, temperature, peaks, argmaxes, sums, logits.stride(0), n, width,
        W_PAD=triton.next_power_of_2(width), PER=per, num_warps=CONFIG["warps"],
    )  # fmt: skip
    return peaks, argmaxes, sums


def block_stats_reference(
    logits: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`block_stats` in torch."""
    b, v = logits.shape
    n = vocab_blocks(v)
    scale = torch.where(temperature <= 0, torch.ones_like(temperature), temperature)
    x = (logits.float() / scale[:, None]).view(b, n, v // n)
    peaks = x.amax(dim=-1)
    argmaxes = x.argmax(dim=-1) + torch.arange(n, device=logits.device) * (v // n)
    sums = torch.exp(x - peaks[..., None]).sum(dim=-1)
    return peaks, argmaxes, sums


def sample_from_block_stats(
    logits: torch.Tensor,
    peaks: torch.Tensor,
    argmaxes: torch.Tensor,
    sums: torch.Tensor,
    state: SlotState,
    rows: slice | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sampler.sample` in the plain mode from `block_stats`: (token int64 [B], log-prob float32 [B])."""
    temperature = state.temperature[rows]
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    b, v = logits.shape
    n = peaks.shape[1]
    width = v // n
    peak = peaks.amax(dim=-1, keepdim=True)  # [B, 1]
    argmax = argmaxes.gather(1, peaks.argmax(dim=-1, keepdim=True)).squeeze(1)
    mass = sums * torch.exp(peaks - peak)
    cum = mass.cumsum(dim=-1)
    total = cum[:, -1]
    u = uniform(state.seed[rows], state.generated[rows])
    target = (u * total)[:, None]
    block = torch.searchsorted(cum, target, right=True).clamp(max=n - 1)  # [B, 1]
    before = torch.where(block > 0, cum.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target))
    cols = block * width + torch.arange(width, device=logits.device)  # [B, width]
    inner = torch.exp(logits.gather(1, cols).float() / scale[:, None] - peak).cumsum(dim=-1)
    rest = torch.minimum(target - before, inner[:, -1:] * (1 - 1e-6))  # rounding: stay inside the block
    drawn = torch.searchsorted(inner, rest, right=True).clamp(max=width - 1)
    sampled = (block * width + drawn).squeeze(1)
    token = torch.where(greedy, argmax, sampled)
    lse = peak.squeeze(1) + torch.log(total)
    log_prob = logits.gather(1, token[:, None]).squeeze(1).float() / scale - lse
    return token, log_prob
