"""Which of the replicas that may take a request should: a score per replica, and tenant-scoped prefix
affinity. Pure: ``dispatch.pick_replica`` calls it on the replicas ``dispatch.accepts`` lets through.

Score (higher is better), each term normalised to [0, 1] and weighted by ``ScoreWeights``:

- ``kv_headroom``: free KV tokens / total KV tokens (1 when the total is not read yet: nothing is known
  to be used, and the replica's own admission still applies);
- ``waiting``: 1 - waiting / ``max_waiting_per_replica`` (requests dispatched there without a first
  token yet: the replica's queue);
- ``itl``: 1 - inter-token latency / the ITL target, floored at 0 (1 when not measured or idle);
- ``prefix``: 1 when the request's prefix key was last sent to this replica (its KV blocks probably
  still hold that prefix, so the prefill there is shorter), and the replica is not saturated; else 0.

Defaults (2, 2, 1, 3) follow llm-d's router (queue 2, KV-cache utilisation 2, prefix 3), plus latency:
an affinity hit outweighs any one load term but not a replica that is worse on all of them.

Saturated (``saturated``): KV used >= ``saturation_kv_used_fraction`` of the total, or its waiting count
at ``max_waiting_per_replica``. A saturated replica gets no affinity bonus, so a tenant's hot prefix
spreads to the next replica instead of piling onto one (the waiting limit is also ``accepts``'s; the KV
fraction is what bites, since ``accepts`` lets a replica take work down to its last free tokens).

The prefix key is scoped by tenant: two tenants with the same prompt get different keys, so one tenant's
traffic never steers another's placement (llm-d's router keys by prompt alone).

``PlacementRule`` (``SLUICE_ROUTER_PLACEMENT``) picks the rule: ``score`` (the above), or one of two
baselines to measure it against (bench/placement_bench.py): ``least_loaded`` (most free KV tokens, then
fewest running, then the smallest replica id; no affinity), ``random`` (``hashed``: a stable hash of the
request id over the replicas that pass, deterministic per request, with no RNG state to own).
"""

from __future__ import annotations

import hashlib
import math
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sluice.policy.load import ReplicaLoad

DEFAULT_BLOCK_SIZE_TOKENS = 16  # the engines' KV block size (the CPU engine's and TensorRT-LLM's default)
_SCORE_DECIMALS = 9  # scores are compared rounded: equal scores must not be ordered by rounding noise


class PlacementRule(StrEnum):
    """How a replica is chosen among those that pass the dispatch gate."""

    SCORE = "score"  # weighted load terms plus tenant-scoped prefix affinity (the default)
    LEAST_LOADED = "least_loaded"  # baseline: most free KV tokens, then fewest running; no affinity
    RANDOM = "random"  # baseline: a stable hash of the request id; no load, no affinity


def prefix_key(
    tenant_id: str,
    prompt_token_ids: Sequence[int],
    block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
    num_blocks: int = 4,
) -> int | None:
    """A stable 64-bit key of the tenant and the prompt's leading full KV blocks (at most ``num_blocks``
    of ``block_size_tokens``), the same in every process and run (BLAKE2b, not Python's salted ``hash``);
    None when the prompt has no full block (nothing a replica could reuse)."""
    if block_size_tokens < 1 or num_blocks < 1:
        raise ValueError("block_size_tokens and num_blocks must be >= 1")
    num_full = min(len(prompt_token_ids) // block_size_tokens, num_blocks)
    if num_full == 0:
        return None
    digest = hashlib.blake2b(digest_size=8)
    tenant = tenant_id.encode()
    # NOTE: the tenant's length goes first, so no (tenant, tokens) pair can collide with another by
    # moving bytes across the boundary.
    digest.update(len(tenant).to_bytes(4, "little"))
    digest.update(tenant)
    tokens = array("q", prompt_token_ids[: num_full * block_size_tokens])  # 8 bytes each, signed
    if sys.byteorder == "big":  # the same key on every gateway, whatever its CPU
        tokens.byteswap()
    digest.update(tokens.tobytes())
    return int.from_bytes(digest.digest(), "little")


@dataclass(frozen=True)
class ScoreWeights:
    """How much each normalised term counts (``SLUICE_ROUTER_WEIGHT_*``); each >= 0."""

    kv_headroom: float = 2.0
    waiting: float = 2.0
    itl: float = 1.0
    prefix: float = 3.0

    def __post_init__(self) -> None:
        for name in ("kv_headroom", "waiting", "itl", "prefix"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"weight {name} must be a finite number >= 0, got {value}")


def saturated(load: ReplicaLoad, saturation_kv_used_fraction: float, max_waiting_per_replica: int) -> bool:
    """Past the point where affinity yields: KV used at or above the fraction, or the waiting places full."""
    if load.num_waiting >= max_waiting_per_replica:
        return True
    if load.total_kv_tokens <= 0:
        return False  # not read yet: nothing known to be used
    used_fraction = 1 - load.free_kv_tokens / load.total_kv_tokens
    return used_fraction >= saturation_kv_used_fraction


def score(
    load: ReplicaLoad,
    affinity_hit: bool,
    weights: ScoreWeights,
    itl_target_ms: float,
    max_waiting_per_replica: int,
) -> float:
    """The replica's score (module docstring): sum of weight x term, each term in [0, 1]. ``affinity_hit``
    is the caller's: the request's prefix was last sent here and the replica is not saturated."""
    if load.total_kv_tokens > 0:
        kv_term = min(1.0, max(0.0, load.free_kv_tokens / load.total_kv_tokens))
    else:
        kv_term = 1.0
    waiting_term = 1.0 - min(1.0, load.num_waiting / max_waiting_per_replica)
    itl_term = 1.0 if load.itl_ms is None else 1.0 - min(1.0, load.itl_ms / itl_target_ms)
    total = (
        weights.kv_headroom * kv_term
        + weights.waiting * waiting_term
        + weights.itl * itl_term
        + weights.prefix * (1.0 if affinity_hit else 0.0)
    )
    return round(total, _SCORE_DECIMALS)


def best(scored: Sequence[tuple[float, ReplicaLoad]]) -> ReplicaLoad | None:
    """The highest score; equal scores go to the smallest replica id (deterministic across runs)."""
    if not scored:
        return None
    return min(scored, key=lambda pair: (-pair[0], pair[1].replica_id))[1]


def least_loaded(loads: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
    """The most free KV tokens, then the fewest running, then the smallest replica id (the rule before
    scoring, with the id tie-break added so the choice does not depend on the order of ``loads``)."""
    if not loads:
        return None
    return min(loads, key=lambda load: (-load.free_kv_tokens, load.num_running, load.replica_id))


def hashed(loads: Sequence[ReplicaLoad], request_id: str) -> ReplicaLoad | None:
    """One of ``loads`` by a stable hash of ``request_id`` (BLAKE2b, the same in every process): requests
    spread evenly and blindly, like a random choice, yet a request asks again for the same replica while
    the set that passes stays the same (replayable; no RNG state)."""
    if not loads:
        return None
    ordered = sorted(loads, key=lambda load: load.replica_id)  # not the caller's order: a stable mapping
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return ordered[int.from_bytes(digest, "little") % len(ordered)]
