"""The simulated replica's step-time model, calibrated ONLY to the seed design's figures for a 70B model
in fp8 on one replica of 4 GPUs (tensor parallel 4). Nothing here is tuned toward the latency targets.

The seed's figures (shared/seeds/000, "Capacity estimates"):

- "An 80 GB GPU holding 17.5 GB of weights (70 B parameters in fp8 across 4 GPUs) leaves ~55 GB for KV.
  At 80 KB per token per GPU that is ~700 k tokens, and at 1 300 tokens per sequence, ~500 concurrent
  sequences."
- "A replica of a 70 B model sustains roughly 2 000 output tokens/s aggregated across its batch."
- "Prefill runs at roughly 10 k prompt tokens/s per replica because it processes the prompt in parallel."
- "Inter-token latency (p95 < 40 ms)".

A step takes ``max(memory time, compute time)`` (a roofline):

- memory time = (weight bytes per GPU + KV bytes per token per GPU x context tokens of every sequence in
  the step) / bandwidth: each step streams the weights once and every sequence's KV once;
- compute time = tokens in the step (decode + prefill) x seconds per token.

Two anchors fix the two free constants: the 2 000 output tokens/s is read as 80 sequences of 1 300
tokens' context decoding at 40 ms a step (80 / 0.040 = 2 000 tokens/s, at the 40 ms ITL target), which
gives the effective bandwidth; pure prefill at 10 000 tokens/s gives the seconds per token.
"""

from __future__ import annotations

from dataclasses import dataclass

# ----- the seed's figures -----
SEED_PARAMS = 70e9
SEED_BYTES_PER_PARAM = 1.0  # fp8
SEED_TENSOR_PARALLEL = 4  # GPUs per replica
SEED_KV_BYTES_FREE_PER_GPU = 55e9  # "leaves ~55 GB for KV"
SEED_KV_BYTES_PER_TOKEN_PER_GPU = 80e3  # "80 KB per token per GPU"
SEED_DECODE_TOKENS_PER_S = 2_000.0  # "roughly 2 000 output tokens/s aggregated across its batch"
SEED_DECODE_ANCHOR_SEQUENCES = 80  # 2 000 tok/s at one token per sequence per 40 ms step
SEED_DECODE_ANCHOR_CONTEXT_TOKENS = 1_300  # "1 300 tokens per sequence"
SEED_PREFILL_TOKENS_PER_S = 10_000.0  # "roughly 10 k prompt tokens/s per replica"
SEED_GPU_HOUR_USD = 4.0  # "A GPU hour is roughly $4"


@dataclass(frozen=True)
class Calibration:
    weights_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_capacity_tokens: int
    bandwidth_bytes_per_s: float  # effective, per GPU
    compute_s_per_token: float
    gpus_per_replica: int
    gpu_hour_usd: float

    def step_time_s(self, num_tokens: int, context_tokens: int) -> float:
        """One step over ``num_tokens`` (decode + prefill) whose sequences hold ``context_tokens`` in KV."""
        memory_s = (
            self.weights_bytes_per_gpu + self.kv_bytes_per_token_per_gpu * context_tokens
        ) / self.bandwidth_bytes_per_s
        return max(memory_s, num_tokens * self.compute_s_per_token)

    @property
    def prefill_tokens_per_s(self) -> float:
        return 1.0 / self.compute_s_per_token

    def peak_output_tokens_per_s(self, prompt_tokens: int, output_tokens: int, itl_target_s: float) -> float:
        """A replica's most output tokens/s in steady state for this token mix with every step at the ITL
        target: D decoding sequences (mean context prompt + output/2) plus the prefill that keeps them fed
        (prompt/output prefill tokens per output token) in one step of ``itl_target_s``."""
        prefill_per_output = prompt_tokens / output_tokens
        mean_context = prompt_tokens + output_tokens / 2
        lo, hi = 0.0, float(self.kv_capacity_tokens)
        for _ in range(60):  # bisection on the (continuous) batch size D
            d = (lo + hi) / 2
            tokens = d * (1 + prefill_per_output)
            context = d * mean_context + d * prefill_per_output  # prefill chunks hold their own tokens
            memory_s = (
                self.weights_bytes_per_gpu + self.kv_bytes_per_token_per_gpu * context
            ) / self.bandwidth_bytes_per_s
            step_s = max(memory_s, tokens * self.compute_s_per_token)
            if step_s <= itl_target_s and d * (prompt_tokens + output_tokens) <= self.kv_capacity_tokens:
                lo = d
            else:
                hi = d
        return lo / itl_target_s


def seed_calibration() -> Calibration:
    """The constants derived from the seed's figures (see the module docstring)."""
    weights = SEED_PARAMS * SEED_BYTES_PER_PARAM / SEED_TENSOR_PARALLEL  # 17.5 GB
    kv_per_token = SEED_KV_BYTES_PER_TOKEN_PER_GPU
    kv_capacity = int(SEED_KV_BYTES_FREE_PER_GPU / kv_per_token)  # 687 500 ("~700 k")
    # The decode anchor: 80 x 1 300 tokens at 40 ms a step is the seed's 2 000 tokens/s.
    anchor_step_s = SEED_DECODE_ANCHOR_SEQUENCES / SEED_DECODE_TOKENS_PER_S  # 0.040
    anchor_context = SEED_DECODE_ANCHOR_SEQUENCES * SEED_DECODE_ANCHOR_CONTEXT_TOKENS
    bandwidth = (weights + kv_per_token * anchor_context) / anchor_step_s  # ~645.5 GB/s effective
    return Calibration(
        weights_bytes_per_gpu=weights,
        kv_bytes_per_token_per_gpu=kv_per_token,
        kv_capacity_tokens=kv_capacity,
        bandwidth_bytes_per_s=bandwidth,
        compute_s_per_token=1.0 / SEED_PREFILL_TOKENS_PER_S,
        gpus_per_replica=SEED_TENSOR_PARALLEL,
        gpu_hour_usd=SEED_GPU_HOUR_USD,
    )
