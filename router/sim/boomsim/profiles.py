"""What an engine's work costs: one profile per hardware and model (pure, cited constants).

Why: the simulator's answers are only as good as these numbers, so each one is a named field
with its source in `docs/simulation.md`, and the few efficiency factors that no public source
gives directly are derived in the open (`h200_qwen3_32b`) from the published figures they were
fitted to, never tuned by hand against the results they are compared with.

The cost shapes:
- prefill step: `step_fixed_s` plus, per request in the step, the FLOPs of its `n` new tokens
  after `ctx` tokens already in KV: `n * linear_flops + attn_flops * n * (ctx + n / 2)` (causal
  attention), at `peak_flops * mfu`;
- decode step: `step_fixed_s` plus reading the weights and every running request's KV once, at
  `hbm_bytes_per_s * mbu`, or its FLOPs if those take longer (large batches);
- KV transfer: `latency_s + tokens * kv_bytes_per_token / bytes_per_s`, one NIXL read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Profile:
    """One engine type (a model on some hardware). Times in seconds, sizes in bytes."""

    name: str
    linear_flops: float
    """FLOPs per token of the weight matmuls (2 x non-embedding parameters)."""
    attn_flops: float
    """FLOPs per token per context token of attention (QK^T and AV)."""
    peak_flops: float
    mfu: float
    """Achieved share of `peak_flops` in prefill."""
    weight_bytes: float
    kv_bytes_per_token: float
    hbm_bytes_per_s: float
    mbu: float
    """Achieved share of `hbm_bytes_per_s` in a decode step."""
    step_fixed_s: float
    """Per engine step: scheduling, launch, tensor-parallel collectives."""
    request_overhead_s: float
    """Per turn, before its first leg starts computing: the HTTP round trips, tokenisation and
    admission that a measured request duration holds beyond its engine steps."""
    xfer_latency_s: float
    """Per KV transfer: handshake, descriptor preparation, notification."""
    xfer_bytes_per_s: float
    """Effective KV transfer throughput (not the link's line rate)."""
    pull_fixed_s: float
    pull_s_per_token: float
    """What a D->P pull costs P beyond the NIXL read itself (admitting the loaded blocks)."""
    block_size: int
    kv_blocks: int
    """KV capacity per engine in blocks (the sweep overrides it)."""
    token_budget: int
    """vLLM's max_num_batched_tokens: tokens one step may compute."""
    max_running: int
    """vLLM's max_num_seqs."""
    tier_tokens: int = 0
    """A prefill engine's CPU memory tier, in tokens (the `cpu-tier` policy)."""
    tier_bytes_per_s: float = 1.0
    """Loading from the CPU tier: host to GPU memory over PCIe, every GPU of the engine."""
    tier_latency_s: float = 0.0
    decode_s_per_request: float = 0.0
    """Per request in a decode step, beyond reading the weights and the KV: the CPU engines'
    per-sequence work (`cpu_engines`); 0 on a GPU, whose step the reads bound."""
    pull_on_compute: bool = False
    """Where a pull's cost beyond the read goes (`pull_fixed_s`, `pull_s_per_token`). False
    (the fit's reading): the request waits and P's other requests go on. True: the step of P
    that first computes the request takes it, so the whole batch waits (a reading of the
    sensitivity table; the fit cannot tell the two apart)."""

    def prefill_s(self, n: int, ctx: int) -> float:
        """Compute time of `n` new tokens after `ctx` cached ones (no fixed part)."""
        flops = n * self.linear_flops + self.attn_flops * n * (ctx + n / 2)
        return flops / (self.peak_flops * self.mfu)

    def decode_s(self, batch: int, kv_tokens: int) -> float:
        """One decode step's variable part for `batch` requests holding `kv_tokens` in all."""
        memory = (self.weight_bytes + kv_tokens * self.kv_bytes_per_token) / (
            self.hbm_bytes_per_s * self.mbu
        )
        compute = (batch * self.linear_flops + self.attn_flops * kv_tokens) / (
            self.peak_flops * self.mfu
        )
        return max(memory, compute) + batch * self.decode_s_per_request

    def transfer_s(self, tokens: int) -> float:
        """One NIXL read of `tokens` tokens of KV (0 tokens: no transfer)."""
        if tokens <= 0:
            return 0.0
        return self.xfer_latency_s + tokens * self.kv_bytes_per_token / self.xfer_bytes_per_s

    def tier_s(self, tokens: int) -> float:
        """Loading `tokens` of KV from the CPU tier (0 tokens: no load)."""
        if tokens <= 0:
            return 0.0
        return self.tier_latency_s + tokens * self.kv_bytes_per_token / self.tier_bytes_per_s

    def pull_s(self, tokens: int) -> float:
        """A D->P pull of `tokens` tokens as P sees it: the read and what it costs P beyond."""
        if tokens <= 0:
            return 0.0
        return self.transfer_s(tokens) + self.pull_fixed_s + self.pull_s_per_token * tokens


# Qwen3-32B's shape (its model card and config.json on the Hugging Face Hub).
QWEN3_32B_NON_EMBEDDING_PARAMS = 31.2e9
QWEN3_32B_PARAMS = 32.8e9
QWEN3_32B_LAYERS = 64
QWEN3_32B_Q_HEADS = 64
QWEN3_32B_KV_HEADS = 8
QWEN3_32B_HEAD_DIM = 128
# NVIDIA H200 SXM (NVIDIA's datasheet): dense BF16 tensor throughput and HBM3e bandwidth.
H200_BF16_FLOPS = 989e12
H200_HBM_BYTES_PER_S = 4.8e12
H200_HBM_BYTES = 141e9
# NVIDIA H100 SXM (NVIDIA's datasheet): the same dense BF16 throughput, HBM3 at 3.35 TB/s, 80 GB.
H100_HBM_BYTES_PER_S = 3.35e12
H100_HBM_BYTES = 80e9
# p5en.48xlarge: 8 x H200, 16 EFA interfaces of 200 Gb/s (the seeds' blog's test environment).
P5EN_GPUS = 8
CPU_TIER_BYTES = 100 * 2**30
"""P's CPU tier per engine: llm-d's P/D multi-tier guide gives prefill engines 100 GiB."""
PCIE_BYTES_PER_S = 25e9
"""ASSUMED: a host-to-GPU KV load per GPU, about 40 % of PCIe Gen5 x16's 64 GB/s a direction
(scattered block copies do not reach line rate); no published OffloadingConnector load rate
on H200 was found. Each of the engine's GPUs loads its own shard of the KV."""
CPU_TIER_LATENCY_S = 0.002
"""ASSUMED: per load, the lookup and the transfer's launch."""
P5EN_EFA_LINE_BYTES_PER_S = 16 * 200e9 / 8

# The seeds' published 1P1D run (vLLM blog, 2026-10-12, "Improve TTFT for Multi-Turn Agentic
# Workloads with Bi-Directional KV Transfer in vLLM"; its sweep script gives the workload):
# prefix lengths 2k-24k, 10 turns of 150 user and 300 answer tokens, P's prefix cache off.
PUBLISHED_PREFIX = (2000, 24000)
PUBLISHED_PREFILL_OFF_S = (0.153, 0.744)
"""The recompute-only prefill duration at the shortest and longest prefix."""
PUBLISHED_XFER_S = (0.030, 0.130)
"""The D->P KV-transfer time at the shortest and longest prefix."""
PUBLISHED_TURNS, PUBLISHED_USER, PUBLISHED_ANSWER = 10, 150, 300


PUBLISHED_PREFILL_ON_S = (0.128, 0.414)
"""The prefill duration with D->P pulls (transfer included) at the shortest and longest prefix."""


def turn_prompts(prefix: int) -> list[int]:
    """The prompt length of each turn of one of the published conversations."""
    step = PUBLISHED_USER + PUBLISHED_ANSWER
    return [prefix + PUBLISHED_USER + k * step for k in range(PUBLISHED_TURNS)]


def pulled_tokens(prefix: int) -> list[int]:
    """What each follow-up pulls from D: the previous prompt and its answer, less the answer's
    last token (D holds no KV for it)."""
    return [p + PUBLISHED_ANSWER - 1 for p in turn_prompts(prefix)[:-1]]


@dataclass(frozen=True, slots=True)
class GpuFit:
    """The GPU profile's fitted efficiencies (`calibrate.fit_gpu` derives them)."""

    mfu: float
    request_overhead_s: float
    pull_fixed_s: float
    pull_s_per_token: float


GPU_FIT = GpuFit(
    mfu=0.4356, request_overhead_s=0.03520, pull_fixed_s=0.02310, pull_s_per_token=6.878e-6
)
"""Printed by `python -m boomsim fit` (`calibrate.fit_gpu`); a test re-derives it."""
GPU_STEP_FIXED_S = 0.005
"""ASSUMED: an engine step's fixed cost (scheduling, launch, TP all-reduce) at TP 8."""
GPU_MBU = 0.6
"""ASSUMED: the decode step's share of HBM bandwidth."""


def kv_bytes_qwen3_32b() -> int:
    return 2 * QWEN3_32B_LAYERS * QWEN3_32B_KV_HEADS * QWEN3_32B_HEAD_DIM * 2  # K and V, BF16


def nixl_read() -> tuple[float, float]:
    """The NIXL read's latency (s) and throughput (bytes/s), from the published transfer times
    at 2k and 24k over the mean tokens pulled there (two points, a line)."""
    kv = kv_bytes_qwen3_32b()
    (lo, hi), (x_lo, x_hi) = PUBLISHED_PREFIX, PUBLISHED_XFER_S
    b_lo = sum(pulled_tokens(lo)) / (PUBLISHED_TURNS - 1) * kv
    b_hi = sum(pulled_tokens(hi)) / (PUBLISHED_TURNS - 1) * kv
    per_byte = (x_hi - x_lo) / (b_hi - b_lo)
    return x_lo - b_lo * per_byte, 1 / per_byte


def h200_qwen3_32b(kv_blocks: int | None = None, fit: GpuFit = GPU_FIT) -> Profile:
    """Qwen3-32B in BF16 at TP 8 on one p5en.48xlarge per role.

    From public specifications: the model's shape (FLOPs and KV bytes per token), the GPUs'
    peak BF16 FLOPs and HBM bandwidth, the KV capacity (90 % of HBM less the weights). Fitted,
    each to a published figure other than the TTFT it is compared with (`calibrate.py`): the
    NIXL read's latency and throughput to the published transfer times; `mfu` and the per-turn
    `request_overhead_s` to the recompute-only prefill durations; the pull's cost on P beyond
    the read (`pull_fixed_s`, `pull_s_per_token`) to the prefill durations with pulls.
    Assumed: `GPU_STEP_FIXED_S`, `GPU_MBU` (no public Qwen3-32B TP8 step time was found)."""
    kv_bytes = kv_bytes_qwen3_32b()
    latency, throughput = nixl_read()
    usable = P5EN_GPUS * H200_HBM_BYTES * 0.9 - QWEN3_32B_PARAMS * 2
    return Profile(
        name="h200-qwen3-32b-tp8",
        linear_flops=2 * QWEN3_32B_NON_EMBEDDING_PARAMS,
        attn_flops=4 * QWEN3_32B_LAYERS * QWEN3_32B_Q_HEADS * QWEN3_32B_HEAD_DIM,
        peak_flops=P5EN_GPUS * H200_BF16_FLOPS,
        mfu=fit.mfu,
        weight_bytes=QWEN3_32B_PARAMS * 2,
        kv_bytes_per_token=kv_bytes,
        hbm_bytes_per_s=P5EN_GPUS * H200_HBM_BYTES_PER_S,
        mbu=GPU_MBU,
        step_fixed_s=GPU_STEP_FIXED_S,
        request_overhead_s=fit.request_overhead_s,
        xfer_latency_s=latency,
        xfer_bytes_per_s=throughput,
        pull_fixed_s=fit.pull_fixed_s,
        pull_s_per_token=fit.pull_s_per_token,
        block_size=16,
        kv_blocks=kv_blocks if kv_blocks is not None else int(usable / (kv_bytes * 16)),
        token_budget=8192,
        max_running=256,
        tier_tokens=int(CPU_TIER_BYTES / kv_bytes),
        tier_bytes_per_s=P5EN_GPUS * PCIE_BYTES_PER_S,
        tier_latency_s=CPU_TIER_LATENCY_S,
    )


def h100_qwen3_32b(kv_blocks: int | None = None) -> Profile:
    """Qwen3-32B in BF16 at TP 8 on one p5.48xlarge (8 x H100 SXM, 3,200 Gb/s of EFA, as
    p5en) per role. From public specifications: HBM bandwidth and capacity (so the decode
    step and the KV capacity); the peak BF16 FLOPs are H200's. ASSUMED, not fitted on H100 (no
    public P/D figure on it was found): the efficiencies, the per-turn overhead, the NIXL read
    and the pull's cost on P are the H200 profile's fit."""
    h200 = h200_qwen3_32b()
    usable = P5EN_GPUS * H100_HBM_BYTES * 0.9 - QWEN3_32B_PARAMS * 2
    blocks = int(usable / (h200.kv_bytes_per_token * h200.block_size))
    return dataclasses.replace(
        h200,
        name="h100-qwen3-32b-tp8",
        hbm_bytes_per_s=P5EN_GPUS * H100_HBM_BYTES_PER_S,
        kv_blocks=kv_blocks if kv_blocks is not None else blocks,
    )


# The CPU engines' transfer, measured once (`make bench-paths`, docs/measurements.md): the
# 6.6M-parameter local model on vLLM's CPU build. Everything else of a CPU profile comes from the
# engine set it stands for (`cpu_engines`).
CPU_CONTINUE_16_S = 0.054
"""A 16-token suffix continued on D after a 4,096-token history (whole TTFT)."""
CPU_PULL_4K_S = 0.158
"""A pull of a 4,096-token history with a 16-token suffix (whole TTFT)."""
CPU_PATHS_PREFILL_TOKENS_PER_S = 5438.0
"""P's prefill rate at 1,024 tokens in the sitting that measured the two above."""
CPU_BLOCK_SIZE = 128
CPU_SPARE_BLOCKS = 100_000
"""Blocks per engine where a regime does not bound them: more than any regime's conversations
hold (the CPU engine's KV space, 4 GiB of the tiny model's KV)."""


@dataclass(frozen=True)
class DecodeStep:
    """A CPU decoder's step: `fixed_s + per_request_s * batch + per_kv_token_s * kv_tokens`."""

    fixed_s: float
    per_request_s: float
    per_kv_token_s: float


def cpu_engines(
    p_linear_s: float, p_quadratic_s: float, step: DecodeStep, kv_blocks: int = CPU_SPARE_BLOCKS
) -> Profile:
    """The local CPU stack's engines (`boomsim.cpu`): P's prefill time `p_linear_s * n +
    p_quadratic_s * n * n` as the engine set measured it idle (`boomerang.local.calibrate`),
    D's decode step as `step` gives it (the KV term is the step's read; where the batch's
    tokens at P's prefill rate take longer, they count instead), and the fixed costs from the
    measured continue and pull: a turn D serves from its own cache pays only the engine's
    admission of a request (the continue, less its 16 tokens), and a pull pays that admission
    and the NIXL read of its 4,096 tokens, which gives the read's cost per token."""
    peak = 1e12  # a unit: the FLOPs below are chosen so that prefill takes the measured time
    rate = CPU_PATHS_PREFILL_TOKENS_PER_S
    admission = CPU_CONTINUE_16_S - 16 / rate
    per_token = max(1e-7, (CPU_PULL_4K_S - admission - 16 / rate) / 4096)
    kv_bytes = 4096.0  # a unit: throughput below is per token through it
    return Profile(
        name="cpu-engines",
        linear_flops=peak * p_linear_s,
        attn_flops=peak * p_quadratic_s * 2,  # n * (ctx + n / 2) at ctx 0 is n * n / 2
        peak_flops=peak,
        mfu=1.0,
        weight_bytes=0.0,
        kv_bytes_per_token=kv_bytes,
        hbm_bytes_per_s=kv_bytes / step.per_kv_token_s if step.per_kv_token_s > 0 else math.inf,
        mbu=1.0,
        step_fixed_s=step.fixed_s,
        request_overhead_s=admission,
        xfer_latency_s=0.0,
        xfer_bytes_per_s=kv_bytes / per_token,
        pull_fixed_s=0.0,
        pull_s_per_token=0.0,
        block_size=CPU_BLOCK_SIZE,
        kv_blocks=kv_blocks,
        token_budget=2048,
        max_running=64,
        decode_s_per_request=step.per_request_s,
    )


PROFILES: dict[str, Callable[[], Profile]] = {"h200": h200_qwen3_32b, "h100": h100_qwen3_32b}
"""The GPU profiles a plan runs on, by name (`plan.py`; the CPU engines' is built per engine
set: `cpu_engines`)."""
