"""The first-GPU-node check end to end, on one node: build a TensorRT-LLM engine of a local checkpoint (the
dev checkpoint by default), render the replica's repository from it as a replica does, start the image's
``tritonserver`` on it, start a gateway routing to it statically with the engine's build config (the
``tensorrt_llm`` dialect and the engine limits, as a registry version carries them), run the five
checks through that gateway (``control_plane.smoke.checks``), and stop everything in one ``finally``.

    results = run_smoke(SmokeOptions(work_dir=Path("/tmp/smoke")))

The build and the replica are parameters (``build``, ``replica``): the real ones are
``build_engines.pipeline.build_local`` and the image's tritonserver (``image_replica``); the tests put a
named fake in their place, on machines with no GPU, and run the rest as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from build_engines.pipeline import LocalBuild, build_local
from build_engines.replica_launch import triton_env, world_size
from build_engines.repository import render_for_replica
from build_engines.spec import BuildSpec
from build_engines.trtllm_release import EXAMPLES_DIR
from control_plane.smoke.checks import CheckResult, SmokeTarget, run_checks
from replicas.launcher import (
    IMAGE_TRITON_ROOT,
    TritonServer,
    TritonServerConfig,
    die_with_parent,
    image_program,
)
from replicas.local_replica import free_ports
from sluice.stores.tenants.base import DEV_TENANT_KEYS

Say = Callable[[str], None]
Build = Callable[[BuildSpec, Path, Say], LocalBuild]
# (repository, the version's build config, a state folder) -> a tritonserver not started yet
Replica = Callable[[Path, Mapping[str, Any], Path], TritonServer]

GATEWAY_READY_TIMEOUT_S = 60.0
GATEWAY_STOP_TIMEOUT_S = 15.0
_LOG_TAIL_LINES = 40


class SmokeError(RuntimeError):
    """A step before the checks failed (build, render, tritonserver, gateway): the message says which."""


@dataclass(frozen=True)
class SmokeOptions:
    work_dir: Path  # checkpoint (when the dev one), engine, repository, logs
    checkpoint_dir: Path | None = None  # None: write the dev checkpoint into work_dir
    model: str = "sluice-smoke"
    version: str = "1"
    # The engine's limits: small enough for the dev checkpoint (2,048 positions).
    max_batch_size: int = 8
    max_num_tokens: int = 2048
    max_input_len: int = 1024
    max_seq_len: int = 2048
    trtllm_examples: Path = EXAMPLES_DIR
    triton_root: Path = IMAGE_TRITON_ROOT
    replica_ready_timeout_s: float = 600.0  # loading an engine, on a cold node

    def spec(self, checkpoint_dir: Path) -> BuildSpec:
        """The build: the trtllm target of a local checkpoint (nothing is uploaded: ``build_local``)."""
        return BuildSpec(
            source_uri=str(checkpoint_dir),
            model=self.model,
            version=self.version,
            target="trtllm",
            # NOTE: BuildSpec wants a destination; build_local never uploads, so this is never written.
            dest_uri=f"s3://local-smoke/engines/{self.model}/{self.version}",
            max_batch_size=self.max_batch_size,
            max_num_tokens=self.max_num_tokens,
            max_input_len=self.max_input_len,
            max_seq_len=self.max_seq_len,
        )


def engine_build(options: SmokeOptions) -> Build:
    """The real build: ``build_local`` with the release's examples/."""

    def build(spec: BuildSpec, work_dir: Path, say: Say) -> LocalBuild:
        return build_local(spec, work_dir=work_dir, trtllm_examples=options.trtllm_examples, say=say)

    return build


def image_replica(options: SmokeOptions) -> Replica:
    """The real replica: the NGC image's tritonserver, in orchestrator mode for a tp x pp > 1 engine."""

    def replica(repository: Path, build_config: Mapping[str, Any], state_dir: Path) -> TritonServer:
        program = image_program(options.triton_root, triton_env(build_config))
        return TritonServer(
            replica_config(repository, state_dir, options.replica_ready_timeout_s), program=program
        )

    return replica


def run_smoke(
    options: SmokeOptions, *, build: Build, replica: Replica, say: Say = print
) -> list[CheckResult]:
    """Build, render, serve, check, stop (module docstring). SmokeError when a step before the checks
    fails; the checks' own failures are in the results."""
    work = options.work_dir
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = options.checkpoint_dir or _dev_checkpoint(work / "checkpoint", say)
    built = build(options.spec(checkpoint), work / "build", say)
    limits = built.build_config["engine_limits"]
    say(f"engine built: {built.artifact_dir} ({built.weights_digest}), limits {limits}")
    repository = work / "repository"
    render_for_replica(
        built.artifact_dir,
        repository,
        options.model,
        options.version,
        built.build_config,
        expected_digest=built.weights_digest,
    )
    say(f"repository rendered: {repository} ({world_size(built.build_config)} GPU rank(s))")
    server = replica(repository, built.build_config, work / "triton")
    gateway = GatewayProcess(work / "gateway", options.model, built, server)
    try:
        say("starting tritonserver (loading the engine)...")
        server.start()
        say(f"tritonserver ready: gRPC {server.grpc_url}; starting the gateway...")
        gateway.start()
        say(f"gateway ready: {gateway.base_url}; running the checks")
        target = SmokeTarget(
            base_url=gateway.base_url,
            api_key=DEV_TENANT_KEYS["acme"],
            model=options.model,
            max_input_len=int(limits["max_input_len"]),
            cancel_max_tokens=min(512, int(limits["max_seq_len"]) // 2),
            replica_metrics_url=server.metrics_url,
        )
        return run_checks(target)
    finally:
        gateway.stop()
        server.stop()
        say(f"stopped the gateway and tritonserver (logs and engine kept in {work})")


def replica_config(repository: Path, state_dir: Path, ready_timeout_s: float) -> TritonServerConfig:
    """A smoke replica's tritonserver on free loopback ports."""
    http, grpc, metrics = free_ports(3)
    return TritonServerConfig(
        model_repository=repository,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        state_dir=state_dir,
        shm_prefix=f"sluice_smoke_{os.getpid()}_",
        ready_timeout_s=ready_timeout_s,
        stop_timeout_s=30.0,
        exit_timeout_s=10,
    )


def _dev_checkpoint(out_dir: Path, say: Say) -> Path:
    """The dev checkpoint (``make run``'s sluice-tiny: random weights, real tokenizer), written once."""
    if not (out_dir / "model.safetensors").is_file():
        say(f"writing the dev checkpoint to {out_dir}")
        subprocess.run([sys.executable, "-m", "cpu_engine.devckpt", "--out", str(out_dir)], check=True)
    return out_dir


class GatewayProcess:
    """``python -m gateway`` routing statically to ``server`` with the build's config: the dev tenants on,
    SQLite and quotas in its own state folder, none of the caller's ``SLUICE_*`` settings. The gateway's
    own prompt bound is well above the engine's, so the engine's ``max_input_len`` is what refuses a long
    prompt. Its log goes to ``state_dir/gateway.log``."""

    def __init__(self, state_dir: Path, model: str, built: LocalBuild, server: TritonServer) -> None:
        self.state_dir = state_dir
        self._model = model
        self._built = built
        self._server = server
        self._port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "gateway.log"

    def env(self) -> dict[str, str]:
        gateway_port, control_plane_port = free_ports(2)
        self._port = gateway_port
        limits = self._built.build_config["engine_limits"]
        ours = {
            "SLUICE_STATE_DIR": str(self.state_dir),
            "SLUICE_ROUTING": "static",
            "SLUICE_ENGINE_CLIENT": "triton",
            "SLUICE_MODEL_NAME": self._model,
            "SLUICE_CHECKPOINT_DIR": str(self._built.artifact_dir),  # its tokenizer and config.json
            "SLUICE_STATIC_BUILD_CONFIG": json.dumps(self._built.build_config),
            "SLUICE_TRITON_GRPC_URL": self._server.grpc_url,
            "SLUICE_TRITON_METRICS_URL": self._server.metrics_url,
            "SLUICE_GATEWAY_HOST": "127.0.0.1",
            "SLUICE_GATEWAY_PORT": str(gateway_port),
            "SLUICE_CONTROL_PLANE_PORT": str(control_plane_port),
            "SLUICE_DEV_TENANTS": "true",
            "SLUICE_BATCH_RUNNER": "false",
            "SLUICE_MAX_PROMPT_TOKENS": str(4 * limits["max_seq_len"]),
            "SLUICE_SHUTDOWN_GRACE_S": "2",
        }
        inherited = {k: v for k, v in os.environ.items() if not k.upper().startswith("SLUICE_")}
        return {**inherited, **ours}

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = self.env()
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gateway"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + GATEWAY_READY_TIMEOUT_S
        ready_url = self.base_url.removesuffix("/v1") + "/readyz"
        while not _answers_200(ready_url):
            code = self._proc.poll()
            if code is not None:
                raise SmokeError(f"the gateway exited with {code} at start:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise SmokeError(
                    f"the gateway was not ready within {GATEWAY_READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])
        return "(no gateway log)"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL its process group after ``GATEWAY_STOP_TIMEOUT_S``. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(GATEWAY_STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
