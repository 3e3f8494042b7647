"""Sluice's configuration: one typed object, from ``SLUICE_*`` environment variables, read once at start.

Call ``get_settings()`` (cached) at start-up; never read ``os.environ`` elsewhere. Every default is for the
embedded dev set-up (``make run``): state under ``.sluice/``, SQLite, Triton on loopback. An unknown
``SLUICE_*`` variable, or a value out of range, fails at start with ``SettingsError`` naming the variable.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sluice.names import parse_files_url, triton_model_name_problem
from sluice.policy.degrade import Fallbacks, parse_degradation
from sluice.pricing import Prices, parse_prices, prices_from

ENV_PREFIX = "SLUICE_"

_HOST_PORT = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")
# The default prompt character bound per prompt token: text averages 3-5 characters a token; only long
# runs of spaces or punctuation (one token of up to ~80 characters) come near 16 on average.
PROMPT_CHARS_PER_TOKEN = 16
# The seed's inter-token SLO (p95), SLUICE_ITL_TARGET_MS's default.
ITL_TARGET_MS = 40.0
TELEMETRY_SINKS = ("file", "stdout", "redis")  # SLUICE_TELEMETRY_SINKS' choices (gateway/telemetry)


class SettingsError(ValueError):
    """The configuration is wrong; the message names the ``SLUICE_*`` variable(s) and what is allowed."""


class Settings(BaseSettings):
    """Every knob, with its unit in its name. Environment: ``SLUICE_<FIELD NAME IN CAPITALS>``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    # Where runtime state lives (checkpoint, SQLite file, telemetry); git-ignored.
    state_dir: Path = Path(".sluice")

    # Storage. No URL: an SQLite file at <state_dir>/sluice.db (see ``sqlite_path``).
    database_url: str | None = None
    database_pool_max_size: int = Field(10, ge=1, le=200)
    redis_url: str | None = None
    redis_key_prefix: str = "sluice:"  # every Sluice key in Redis starts with this
    # Redis unreachable: quotas are enforced per gateway for this long, then requests are refused.
    quota_fail_open_s: float = Field(30.0, ge=0, le=3600)
    # Idempotency-Key: completed results are replayed this long.
    idempotency_ttl_s: float = Field(24 * 3600.0, gt=0, le=30 * 24 * 3600)
    # Idempotency-Key records kept per tenant; past it that tenant's least recently written one is
    # forgotten (a retry of it is a new, billed request), never another tenant's.
    idempotency_max_records_per_tenant: int = Field(10_000, ge=1, le=10_000_000)

    # Gateway.
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(8080, ge=1, le=65535)
    max_body_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    request_deadline_s: float = Field(60.0, gt=0, le=3600)
    telemetry_path: Path  # default <state_dir>/telemetry.jsonl
    # Telemetry is written by a background thread: the file rotates at telemetry_max_bytes, keeping
    # telemetry_num_backups older files (.1 newest); records beyond the queue are dropped and counted.
    telemetry_max_bytes: int = Field(64 * 1024 * 1024, ge=4096, le=1024**4)
    telemetry_num_backups: int = Field(3, ge=0, le=100)
    telemetry_queue_max_records: int = Field(10_000, ge=1, le=1_000_000)
    # Where each record goes: a comma list of file (telemetry_path), stdout (JSON lines), redis (a stream
    # at redis_url named telemetry_redis_stream, trimmed to about telemetry_redis_maxlen entries); each
    # sink has its own queue of telemetry_queue_max_records (gateway/telemetry).
    telemetry_sinks: str = "file"
    telemetry_redis_stream: str = Field("sluice:telemetry", min_length=1, max_length=512)
    telemetry_redis_maxlen: int = Field(100_000, ge=1_000, le=100_000_000)
    tenant_cache_ttl_s: float = Field(5.0, ge=0, le=3600)  # 0: every request goes to the store
    # A "no such key" is cached this long (at most tenant_cache_ttl_s): a flood of random keys costs one
    # query per key per this interval, not per request.
    tenant_unknown_ttl_s: float = Field(1.0, ge=0, le=3600)
    # Tenant store down: a key resolved at most this long ago keeps working from its last good view;
    # other keys get 503 tenant_store_unavailable.
    tenant_stale_max_s: float = Field(600.0, ge=0, le=24 * 3600)
    # Tenant store down: at most one query per this interval checks whether it is back (Retry-After).
    tenant_store_probe_interval_s: float = Field(1.0, gt=0, le=300)
    # A tenant lookup slower than this counts as the store being down.
    tenant_lookup_timeout_s: float = Field(2.0, gt=0, le=60)
    # Tenant lookups in flight at once per gateway; more wait, so random keys cannot exhaust the pool.
    tenant_max_concurrent_lookups: int = Field(4, ge=1, le=200)
    # Seed acme/sk-acme-dev and globex/sk-globex-dev: keys anyone can read in the source, so off unless
    # asked for (``make run`` asks); the gateway logs a warning at start while they are on.
    dev_tenants: bool = False
    # Clients (per connection). A client that has not read for client_write_timeout_s while the gateway
    # has output for it (its send buffer full) is cut off and its request cancelled and metered. The
    # kernel send buffer and the transport's write buffer are each bounded to client_send_buffer_bytes,
    # so that state is reached after that much unread output, not after megabytes.
    client_write_timeout_s: float = Field(30.0, gt=0, le=3600)
    client_send_buffer_bytes: int = Field(64 * 1024, ge=4096, le=16 * 1024 * 1024)
    # From connecting (or from a request's first byte) to the end of its head; then the connection closes.
    client_header_timeout_s: float = Field(10.0, gt=0, le=600)
    max_request_head_bytes: int = Field(64 * 1024, ge=1024, le=1024 * 1024)  # request line + headers; 431
    keep_alive_timeout_s: int = Field(5, ge=1, le=600)  # an idle keep-alive connection is closed after it
    # Per gateway process, connections and requests each; over it a new request gets 503. Keep it under the
    # process's open-file limit (ulimit -n), which the database and Redis pools share.
    max_connections: int = Field(512, ge=1, le=1_000_000)
    # SIGTERM/SIGINT: streams still running this long after the gateway stopped accepting are cancelled
    # (each metered as cancelled by its own ending), so a restart never waits out a long batch request.
    shutdown_grace_s: int = Field(30, ge=0, le=3600)

    # Control plane: the admin API (``python -m control_plane.service``), on a port of its own.
    control_plane_host: str = "127.0.0.1"
    control_plane_port: int = Field(8090, ge=1, le=65535)
    # What the `sluice` CLI's admin commands (models, versions, replicas, routes, rollout) talk to, and the
    # admin token they present (``sladm-...``; never a tenant key). Default URL: the control plane above.
    admin_url: str | None = None
    admin_token: str | None = None

    # Scheduling (issue 4): per-model fair queue, admission from the drain rate, dispatch gate.
    batch_request_deadline_s: float = Field(600.0, gt=0, le=24 * 3600)  # service_tier "flex"
    # The seed's inter-token SLO: a replica whose observed inter-token p95 is above it takes nothing new,
    # and rendered replicas keep their steps and send budgets inside it (replicas.render).
    itl_target_ms: float = Field(ITL_TARGET_MS, gt=0, le=10_000)
    # The gateway reads a stream's gaps before its SSE write and the client's read, which add a little
    # on a busy machine (measured: the client's p95 1-3 ms above the gateway's at 64 streams on 2 cores),
    # and a run's p95 swings a few ms around the setpoint the cap holds. The dispatch gate and the batch
    # bound hold the gateway's read this share under the target (``itl_setpoint_ms``, 34 ms at 40), so
    # what a client reads meets it (docs/benchmarks.md, issue 22: Zen 3, then the Xeon's setpoint sweep).
    itl_headroom_fraction: float = Field(0.15, ge=0, lt=1)
    prefill_tokens_per_s: float = Field(5_000.0, gt=0)  # estimate, for "can it still meet its deadline"
    max_waiting_per_replica: int = Field(8, ge=1, le=10_000)  # dispatched, no first token yet
    # Batch work and tenants over their fair share yield: they leave this much KV free, and need the
    # replica's ITL under these shares of the target, so the headroom stays for everyone else.
    yield_kv_reserve_fraction: float = Field(0.2, ge=0, lt=1)
    batch_itl_fraction: float = Field(0.9, gt=0, le=1)
    over_share_itl_fraction: float = Field(0.75, gt=0, le=1)
    fair_share_tolerance: float = Field(0.25, ge=0)  # over share = holding > (1 + this) x weighted share
    batch_floor_share: float = Field(0.1, ge=0, lt=1)  # of dispatched tokens, while both classes wait
    batch_max_wait_s: float = Field(30.0, gt=0)  # ageing: a batch request waiting this long goes first
    replica_poll_interval_ms: float = Field(250.0, ge=10, le=10_000)  # replica metrics read period
    # Degradation under persistent overload (issue 12): JSON of model -> fallbacks taken only while that
    # model is overloaded (sluice/policy/degrade.py), e.g. {"sluice-tiny": {"max_tokens_cap": 64,
    # "to_batch": true, "alias_to": "sluice-nano", "overload_wait_s": 2, "enter_after_s": 10,
    # "exit_after_s": 30}}; unset: no model degrades.
    degradation: str | None = None
    # Usage reports' prices (issue 15; sluice/pricing.py): JSON of model -> USD per million prompt and
    # output tokens, "*" for every model not listed, e.g. {"*": {"prompt_usd_per_m": 0.2,
    # "output_usd_per_m": 0.6}}; unset: reports show tokens and no cost. Batch-class tokens (batch lines,
    # service_tier "flex") cost (1 - batch_discount) of the price.
    prices: str | None = None
    batch_discount: float = Field(0.5, ge=0, lt=1)
    # Failover (issue 12): a request whose replica fails before the client saw output is dispatched again to
    # another replica, at most max_redispatches times (0: never); a replica a request could not reach
    # takes nothing new from this gateway until it answers a readiness check, asked every
    # replica_suspension_ms.
    max_redispatches: int = Field(2, ge=0, le=10)
    replica_suspension_ms: float = Field(1_000.0, ge=10, le=60_000)
    # Router (issue 12): among the replicas that may take a request, the best weighted score wins; each
    # term is in [0, 1] (sluice/policy/placement.py). Prefix affinity: a tenant-scoped key of the prompt's
    # first router_prefix_blocks KV blocks prefers the replica it was last sent to (remembered
    # router_affinity_ttl_s) until that replica is saturated.
    router_weight_kv_headroom: float = Field(2.0, ge=0, le=1000)
    router_weight_waiting: float = Field(2.0, ge=0, le=1000)
    router_weight_itl: float = Field(1.0, ge=0, le=1000)
    router_weight_prefix: float = Field(3.0, ge=0, le=1000)  # 0: no prefix affinity
    router_prefix_blocks: int = Field(4, ge=1, le=1024)
    router_affinity_ttl_s: float = Field(300.0, gt=0, le=24 * 3600)
    # The rule among those replicas: "score" (the above), or a baseline to measure it against:
    # "least_loaded" (most free KV, then fewest running; no affinity), "random" (a hash of the request id).
    router_placement: Literal["score", "least_loaded", "random"] = "score"

    # Engine and model.
    # How the gateway knows its replicas: "static" = one replica (triton_grpc_url, or the in-process
    # engine) serving model_name; "registry" = every model, version and replica the registry routes
    # (followed as it changes; needs engine_client "triton").
    routing: Literal["static", "registry"] = "static"
    # How often a gateway following the registry re-reads it when no change notice came (and retries the
    # replicas it could not verify).
    registry_poll_interval_s: float = Field(5.0, gt=0, le=300)
    # Pools by workload shape (issue 12): a prompt of at least this many tokens is queued for its
    # version's long-prompt replicas (registry pool "long-prompt"), shorter ones for its general replicas,
    # so short prompts' first tokens never wait behind long prefills. None: off (every prompt is short).
    long_prompt_min_tokens: int | None = Field(None, ge=1, le=1_000_000)
    engine_client: Literal["triton", "inprocess"] = "triton"
    # Static routing only: the replica's build config as a registry version records it (JSON, e.g.
    # {"target": "trtllm", "engine_limits": {"max_input_len": 1024, ...}}), from which the request
    # dialect (its "target") and the engine limits the gateway enforces follow, by the registry path's own
    # rules; unset: a CPU engine replica bounded by its model's context.
    static_build_config: str | None = None
    triton_grpc_url: str = "127.0.0.1:8001"
    triton_metrics_url: str = "http://127.0.0.1:8002/metrics"
    model_name: str = "sluice-tiny"
    checkpoint_dir: Path  # default <state_dir>/models/<model_name>
    # The CPU engine's number format (the in-process engine, and the Triton model `make run` renders):
    # auto = bfloat16 where the CPU has AVX-512 BF16 or AMX-BF16, float32 elsewhere (faster there).
    engine_dtype: Literal["auto", "float32", "bfloat16"] = "auto"

    # Deterministic limits, checked before any engine work.
    max_prompt_tokens: int = Field(1536, ge=1, le=1_000_000)
    max_output_tokens: int = Field(512, ge=1, le=1_000_000)
    # None, as OpenAI: a request without max_tokens may use min(max_output_tokens, context - prompt).
    default_max_tokens: int | None = Field(None, ge=1)
    # Answers one request may ask for (``n``); each may make max_tokens, and the quota reserves for all.
    max_n: int = Field(8, ge=1, le=128)
    # Characters of prompt text (messages' contents and names, or a completion prompt) accepted before
    # templating and tokenizing; None: PROMPT_CHARS_PER_TOKEN x max_prompt_tokens (see prompt_limit_chars).
    max_prompt_chars: int | None = Field(None, ge=1, le=256 * 1024 * 1024)

    # Safety filters (issue 5): block list, regexes and policies from a JSON file (unset: PII rules only).
    safety_config_path: Path | None = None
    safety_classifier_model: str = "sluice-guard"  # the Triton model behind the "triton" classifier
    safety_holdback_chars: int = Field(64, ge=1, le=4096)  # streamed text withheld until screened

    # Replica health checks (the control plane; docs/operations.md "Replicas"): every
    # replica_health_interval_s, Triton ready at the version plus a one-token probe that must finish within
    # replica_probe_timeout_s (a wedge is caught within two intervals while the timeout is at most the
    # interval); a starting replica (downloading, loading) may fail them for replica_start_grace_s.
    replica_health_interval_s: float = Field(2.0, gt=0, le=300)
    replica_probe_timeout_s: float = Field(2.0, gt=0, le=300)
    replica_start_grace_s: float = Field(120.0, ge=0, le=24 * 3600)
    # What one replica costs an hour (a GPU node's price, in USD; issue 15, docs/operations.md "Dashboards and
    # alerts"): the control plane exports it as sluice_control_plane_replica_hour_price_usd, and the
    # recording rule sluice:cost_per_million_output_tokens_usd divides replicas x price by output tokens.
    # Unset: not exported, and the cost rule yields nothing rather than a made-up figure.
    replica_hour_price_usd: float | None = Field(None, gt=0, le=10_000)

    # Autoscaler (issue 12; control_plane/autoscaler, docs/operations.md "Autoscaling"): off by default.
    # Every autoscaler_interval_s it scrapes the gateways' /metrics (comma-separated URLs) and sets each
    # routed model version's replicas from interactive TTFT p95 and queue wait p95 against their targets
    # and the queue depth per ready replica; min/max bound the routed replicas, the warm pool is on top.
    autoscaler: Literal["off", "on"] = "off"
    autoscaler_actuator: Literal["local", "kubernetes"] = "local"
    autoscaler_gateway_metrics_urls: str = "http://127.0.0.1:8080/metrics"
    autoscaler_interval_s: float = Field(15.0, ge=0.5, le=3600)
    autoscaler_min_replicas: int = Field(1, ge=0, le=10_000)
    autoscaler_max_replicas: int = Field(8, ge=1, le=10_000)
    autoscaler_warm_pool_replicas: int = Field(1, ge=0, le=1_000)
    autoscaler_ttft_slo_ms: float = Field(500.0, gt=0, le=600_000)
    autoscaler_queue_wait_target_ms: float = Field(250.0, gt=0, le=600_000)
    autoscaler_queue_depth_per_replica: float = Field(4.0, gt=0, le=100_000)
    autoscaler_scale_down_cooldown_s: float = Field(300.0, ge=0, le=24 * 3600)
    autoscaler_drain_timeout_s: float = Field(120.0, gt=0, le=24 * 3600)  # then a drained replica stops
    # Kubernetes: one Deployment per model version, named by this template ({model}, {version}; made a
    # DNS-1123 name), scaled through apps/v1 deployments/scale in this namespace.
    autoscaler_kube_namespace: str = "default"
    autoscaler_kube_deployment: str = "sluice-{model}-{version}"

    # Weight store (issue 13; sluice/weight_store, docs/operations.md "Weight store"): artifacts in S3 or an
    # S3-compatible server at this endpoint (unset: AWS; region and credentials from boto3's usual chain),
    # fetched into a content-addressed cache (default <state_dir>/weight-cache) with ranged GETs of
    # weight_store_part_size_bytes, weight_store_max_concurrency requests in flight at once.
    s3_endpoint_url: str | None = None
    weight_cache_dir: Path  # default <state_dir>/weight-cache
    weight_store_part_size_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024, le=5 * 1024**3)
    weight_store_max_concurrency: int = Field(8, ge=1, le=256)

    # Files (issue 15; sluice/stores/files, OpenAI's Files API): uploaded batch input and batch results.
    # Unset: under <state_dir>/files; s3://BUCKET/PREFIX: in that bucket (endpoint: s3_endpoint_url). An
    # upload's file may hold at most file_max_bytes (POST /v1/files alone may exceed max_body_bytes for it).
    # Files may expire (expires_after, output_expires_after): each gateway deletes the expired ones every
    # file_sweep_interval_s (they are unknown to every read from their expiry on).
    files_url: str | None = None
    file_max_bytes: int = Field(100 * 1024 * 1024, ge=1024, le=512 * 1024 * 1024)
    file_sweep_interval_s: float = Field(600.0, gt=0, le=86400)
    # Uploads a gateway reads at once: each holds a few times its size in memory while it is read; more
    # wait up to 5 s, then get 503 too_many_uploads with Retry-After (gateway.upload_slots).
    file_max_concurrent_uploads: int = Field(4, ge=1, le=256)
    # An upload's whole body must arrive this long after the request starts, else 408 upload_timeout (a
    # client trickling its body would hold an upload slot).
    file_upload_timeout_s: float = Field(300.0, gt=0, le=3600)

    # Batches (issue 15; gateway/batches, OpenAI's Batch API). Every gateway runs a batch runner unless
    # batch_runner is false (it then only accepts and reports batches; other gateways run them). A runner
    # works up to batch_max_active batches at once, batch_line_concurrency lines of each; it holds each by
    # a lease of batch_lease_s (a dead gateway's batches resume elsewhere that long after), commits the
    # lines that ended every batch_flush_interval_s or batch_part_max_lines, and looks for new batches
    # every batch_poll_interval_s (at once on this gateway's own POST /v1/batches). At a stop, its running
    # lines get batch_drain_s to end; those still running then are cut, run again by the next runner and
    # billed once, for that run (keep it under the pod's termination grace period).
    batch_runner: bool = True
    batch_max_active: int = Field(4, ge=1, le=256)
    batch_line_concurrency: int = Field(2, ge=1, le=1024)
    batch_lease_s: float = Field(30.0, ge=1, le=3600)
    batch_flush_interval_s: float = Field(2.0, gt=0, le=600)
    batch_part_max_lines: int = Field(256, ge=1, le=100_000)
    batch_poll_interval_s: float = Field(2.0, gt=0, le=600)
    batch_max_lines: int = Field(50_000, ge=1, le=1_000_000)  # per input file, as OpenAI's
    batch_drain_s: float = Field(10.0, ge=0, le=600)
    # A tenant's batches queued or running at once (validating, in_progress, finalizing, cancelling); one
    # more is 429 too_many_batches: each holds a copy of its input and is re-read at every claim, so one
    # tenant's queue (and what runners scan to pick the next batch) stays bounded.
    batch_max_active_per_tenant: int = Field(100, ge=1, le=100_000)

    def __init__(self, **values: Any) -> None:
        check_unknown_env(os.environ)
        super().__init__(**values)

    @model_validator(mode="before")
    @classmethod
    def _derived_defaults(cls, data: Any) -> Any:
        """Paths under ``state_dir`` unless given: moving the state directory moves them all."""
        if isinstance(data, dict):
            state_dir = Path(data.get("state_dir") or ".sluice")
            model_name = data.get("model_name") or "sluice-tiny"
            data.setdefault("checkpoint_dir", state_dir / "models" / str(model_name))
            data.setdefault("telemetry_path", state_dir / "telemetry.jsonl")
            data.setdefault("weight_cache_dir", state_dir / "weight-cache")
        return data

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("postgresql://", "postgres://")):
            raise ValueError(
                "must be a PostgreSQL URL (postgresql://user@host:port/dbname), or unset for SQLite"
            )
        return v

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL, or unset")
        return v

    @field_validator("telemetry_sinks")
    @classmethod
    def _check_telemetry_sinks(cls, v: str) -> str:
        names = [name.strip() for name in v.split(",")]
        unknown = [name for name in names if name not in TELEMETRY_SINKS]
        if unknown or len(set(names)) != len(names):
            raise ValueError(
                f"must be a comma list of distinct sinks among {', '.join(TELEMETRY_SINKS)} (got {v!r})"
            )
        return ",".join(names)

    @field_validator("s3_endpoint_url")
    @classmethod
    def _check_s3_endpoint_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http(s):// URL, e.g. http://127.0.0.1:9000, or unset for AWS")
        return v

    @field_validator("files_url")
    @classmethod
    def _check_files_url(cls, v: str | None) -> str | None:
        if v is not None:
            parse_files_url(v)  # a ValueError says what is wrong with it
        return v

    @field_validator("triton_grpc_url")
    @classmethod
    def _check_grpc_url(cls, v: str) -> str:
        if not _HOST_PORT.fullmatch(v):
            raise ValueError("must be host:port without a scheme, e.g. 127.0.0.1:8001")
        return v

    @field_validator("triton_metrics_url")
    @classmethod
    def _check_metrics_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must be an http(s):// URL, e.g. http://127.0.0.1:8002/metrics")
        return v

    @field_validator("degradation")
    @classmethod
    def _check_degradation(cls, v: str | None) -> str | None:
        if v is not None:
            parse_degradation(v)  # a ValueError names the model and the field at fault
        return v

    @field_validator("prices")
    @classmethod
    def _check_prices(cls, v: str | None) -> str | None:
        if v is not None:
            parse_prices(v)  # a ValueError names the model and the field at fault
        return v

    @field_validator("static_build_config")
    @classmethod
    def _check_static_build_config(cls, v: str | None) -> str | None:
        if v is not None:
            parse_static_build_config(v)  # a ValueError says what is wrong with it
        return v

    @field_validator("model_name")
    @classmethod
    def _check_model_name(cls, v: str) -> str:
        if (problem := triton_model_name_problem(v)) is not None:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _check_ports(self) -> Settings:
        # NOTE: compared whatever the hosts: 0.0.0.0 and 127.0.0.1 collide on one machine too.
        if self.control_plane_port == self.gateway_port:
            raise ValueError(
                f"control_plane_port ({self.control_plane_port}) must differ from gateway_port "
                f"({self.gateway_port}): the admin API has a port of its own"
            )
        return self

    @property
    def itl_setpoint_ms(self) -> float:
        """The inter-token p95 the gateway holds its own read at: the target less the headroom."""
        return self.itl_target_ms * (1 - self.itl_headroom_fraction)

    @model_validator(mode="after")
    def _check_telemetry_redis(self) -> Settings:
        if "redis" in self.telemetry_sink_names and self.redis_url is None:
            raise ValueError(
                "telemetry_sinks names 'redis' but redis_url is unset: set SLUICE_REDIS_URL, or drop "
                "'redis' from SLUICE_TELEMETRY_SINKS"
            )
        return self

    @model_validator(mode="after")
    def _check_routing(self) -> Settings:
        if self.routing == "registry" and self.engine_client != "triton":
            raise ValueError(
                "routing 'registry' routes to the registry's Triton replicas: it needs engine_client "
                "'triton' "
                f"(got {self.engine_client!r})"
            )
        return self

    @model_validator(mode="after")
    def _check_static(self) -> Settings:
        if self.static_build_config is not None and (
            self.routing != "static" or self.engine_client != "triton"
        ):
            raise ValueError(
                "static_build_config describes the one Triton replica of static routing: it needs routing "
                f"'static' and engine_client 'triton' (got {self.routing!r}, {self.engine_client!r}); "
                "with the registry, each version's build config comes from the registry"
            )
        return self

    @model_validator(mode="after")
    def _check_limits(self) -> Settings:
        if self.default_max_tokens is not None and self.default_max_tokens > self.max_output_tokens:
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) must be <= max_output_tokens "
                f"({self.max_output_tokens})"
            )
        return self

    @property
    def prompt_limit_chars(self) -> int:
        """``max_prompt_chars``, or a bound no prompt within ``max_prompt_tokens`` comes near."""
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        return PROMPT_CHARS_PER_TOKEN * self.max_prompt_tokens

    @property
    def degradation_fallbacks(self) -> dict[str, Fallbacks]:
        """``degradation`` parsed: each degrading model's fallbacks (empty: none degrades)."""
        return parse_degradation(self.degradation) if self.degradation is not None else {}

    @property
    def static_build(self) -> dict[str, Any]:
        """``static_build_config`` parsed ({} when unset: a CPU engine replica)."""
        return parse_static_build_config(self.static_build_config) if self.static_build_config else {}

    @property
    def pricing(self) -> Prices:
        """``prices`` and ``batch_discount`` parsed (no prices: nothing is priced)."""
        return prices_from(self.prices, self.batch_discount)

    @property
    def telemetry_sink_names(self) -> tuple[str, ...]:
        """``telemetry_sinks`` as names, in the order given."""
        return tuple(self.telemetry_sinks.split(","))

    @property
    def sqlite_path(self) -> Path:
        """The embedded database file, used when ``database_url`` is unset."""
        return self.state_dir / "sluice.db"


def parse_static_build_config(text: str) -> dict[str, Any]:
    """``SLUICE_STATIC_BUILD_CONFIG`` as an object, or ValueError: not a JSON object, a build target the
    gateway cannot send requests to, or malformed engine limits."""
    # NOTE: imported here, not at the top: the dialects pull in the Triton client, which most processes
    # that read settings never need.
    from sluice.engine_client.dialects import UNSERVABLE, dialect_of
    from sluice.engine_limits import limits_of

    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"must be a JSON object (a version's build config), got {type(config).__name__}")
    dialect = dialect_of(config)
    if dialect in UNSERVABLE:
        raise ValueError(f"target {config.get('target')!r} cannot be served: {UNSERVABLE[dialect]}")
    limits_of(config)
    return config


def env_names() -> list[str]:
    """Every ``SLUICE_*`` variable Sluice reads."""
    return sorted(ENV_PREFIX + name.upper() for name in Settings.model_fields)


def check_unknown_env(environ: Mapping[str, str]) -> None:
    """Fail on a ``SLUICE_*`` variable no setting reads (usually a typo that would be silently ignored)."""
    valid = set(env_names())
    unknown = sorted(k for k in environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in valid)
    if unknown:
        raise SettingsError(
            f"unknown environment variable(s) {', '.join(unknown)}; "
            f"valid names are: {', '.join(sorted(valid))}"
        )


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment (and ``overrides``, which win), or ``SettingsError`` saying why not."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            where = f"{ENV_PREFIX}{field.upper()}" if field in Settings.model_fields else field
            value = _redacted(field, err.get("input"))
            problems.append(redact_secrets(f"{where}={value!r}: {err['msg']}"))
        raise SettingsError("invalid settings:\n  " + "\n  ".join(problems)) from None


# A URL's user-info up to its last "@" (a raw "@" or "/" in a password must not end the match early), and
# key=value pairs of a connection string or query.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^\s@'\"]*)(\S*)@")
_SECRET_PAIR = re.compile(r"(?i)\b(password|passwd|pwd|secret|token|api_key)=([^\s&'\"]+)")
_SECRET_NAME = re.compile(r"(?i)(password|passwd|secret|credential|api_key|private_key|(^|_)token$)")


def redact_secrets(text: str) -> str:
    """``text`` with the passwords of URLs in it (``postgresql://user:***@host``,
    ``redis://:***@host``) and ``password=...``-like pairs replaced by ``***``: for messages and logs."""

    def userinfo(m: re.Match[str]) -> str:
        info = m.group(2) + m.group(3)
        if ":" not in info:
            return m.group(0)
        return f"{m.group(1)}{info.split(':', 1)[0]}:***@"

    return _SECRET_PAIR.sub(r"\1=***", _URL_USERINFO.sub(userinfo, text))


def _redacted(name: str, value: Any) -> Any:
    """An input value as it may be shown: a secret-named field as ``***``, secrets inside text redacted
    (a model-level error's input is the whole mapping of values)."""
    if isinstance(value, Mapping):
        return {k: _redacted(str(k), v) for k, v in value.items()}
    if _SECRET_NAME.search(name) and value is not None:
        return "***"
    if isinstance(value, str):
        return redact_secrets(value)
    return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once. Tests that change the environment call
    ``get_settings.cache_clear()``."""
    return load_settings()
