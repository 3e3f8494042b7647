"""``make run``: the whole dev stack in one foreground process tree, stopped by one Ctrl-C.

1. The dev admin token, seeded if missing (``prepare_dev_admin_token``; none with dev tenants off).
2. A real tritonserver serving the CPU engine's model (version 1) and the safety classifier (HTTP 8000,
   gRPC 8001, metrics 8002 on 127.0.0.1).
3. The registry: the model (``settings.model_name``), its version ``1`` (artifact ``file://<checkpoint>``,
   the checkpoint's weights digest) ``serving``, the route 100% to it when the model has none, and that
   tritonserver as replica ``local-1`` (its gRPC endpoint, and its metrics URL where gateways read its
   load), registered ``starting``. Idempotent: a second run finds them; a checkpoint whose digest
   differs from version 1's is refused with what to do.
4. The control plane (``python -m control_plane.service``, same environment) as a child process: its
   health checks verify ``local-1`` and mark it ready.
5. The gateway, following the registry (routing ``registry``).

Whatever ends the gateway (Ctrl-C, SIGTERM, an error), the ``finally`` blocks stop the control plane,
take ``local-1`` out of the registry and stop the tritonserver, so nothing is left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.app import create_app
from gateway.serving import configure_logging, serve
from replicas.launcher import TritonServer, TritonServerConfig, run_in_foreground
from sluice.settings import Settings, SettingsError, load_settings
from sluice.stores.admin_tokens.base import AdminTokenStoreUnavailable
from sluice.stores.openers import open_registry, prepare_dev_admin_token
from sluice.stores.registry.base import AlreadyExists, Registry, RegistryError, ReplicaState, VersionState
from sluice.stores.tenants.base import DEV_TENANT_KEYS
from sluice.weights_digest import weights_digest

log = logging.getLogger("gateway.devstack")

DEV_VERSION = "1"  # the repository `make repository` renders serves Triton version 1
DEV_REPLICA_ID = "local-1"
ACTOR = "devstack"
CONTROL_PLANE_START_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 60.0  # from the gateway's start to its /readyz, before make run says it is waiting
CONTROL_PLANE_STOP_TIMEOUT_S = 30.0  # it stops its own replicas first


class DevStackError(Exception):
    """The dev stack cannot start; the message says why and what to do."""


def banner(base_url: str, model: str, dev_tenants: bool, admin_url: str, admin_token: str | None) -> str:
    keys = "\n".join(f"    {tenant:<8} {key}" for tenant, key in DEV_TENANT_KEYS.items())
    if not dev_tenants:
        keys = "    (dev tenants disabled: SLUICE_DEV_TENANTS=false)"
    key = DEV_TENANT_KEYS["acme"]
    if admin_token is None:
        admin = (
            "    (no dev admin token: SLUICE_DEV_TENANTS=false, or it was revoked; make one with\n"
            "     `sluice admin-tokens create NAME --role platform-admin`)"
        )
    else:
        admin = f"""    dev admin token (platform-admin): {admin_token}
    curl {admin_url}/admin/v1/replicas -H 'Authorization: Bearer {admin_token}'
    SLUICE_ADMIN_TOKEN={admin_token} sluice replicas list"""
    return f"""
Sluice is up: {base_url}/v1  (model {model}, version {DEV_VERSION} on replica {DEV_REPLICA_ID})
  dev API keys:
{keys}
  try:
    curl -N {base_url}/v1/chat/completions -H 'Authorization: Bearer {key}' \\
      -H 'Content-Type: application/json' \\
      -d '{{"model": "{model}", "stream": true, "messages": [{{"role": "user", "content": "Hello"}}]}}'
  control plane (admin API): {admin_url}/admin/v1  (schema: {admin_url}/schema)
{admin}
  Ctrl-C stops everything.
"""


async def register_dev_model(
    registry: Registry, model: str, checkpoint_dir: Path, endpoint: str, *, metrics_url: str
) -> None:
    """Make the registry route ``model`` version 1 to the replica at ``endpoint``, whose load is read at
    ``metrics_url`` (idempotent; see the module docstring). ``DevStackError`` for a version 1 with other
    weights or retired."""
    digest = await asyncio.to_thread(weights_digest, checkpoint_dir)
    with contextlib.suppress(AlreadyExists):
        await registry.create_model(model, actor=ACTOR, description="the dev model (make run)")
    try:
        version = await registry.add_version(
            model, DEV_VERSION, artifact_uri=checkpoint_dir.resolve().as_uri(), weights_digest=digest,
            build_config={"engine": "cpu_engine"}, actor=ACTOR,
        )  # fmt: skip
    except AlreadyExists:
        version = await registry.get_version(model, DEV_VERSION)
    if version.weights_digest != digest:
        raise DevStackError(
            f"{model} version {DEV_VERSION} is registered with weights {version.weights_digest}, but the "
            f"checkpoint at {checkpoint_dir} digests to {digest}, and a version's weights never change. "
            "Start from fresh state (`make clean`, another SLUICE_STATE_DIR or database), or register the "
            "new weights as a new version and roll it out (`sluice versions add`, `sluice rollout start`)."
        )
    if version.state == VersionState.RETIRED:
        raise DevStackError(
            f"{model} version {DEV_VERSION} is retired: start from fresh state (`make clean`)"
        )
    for state in (VersionState.WARMING, VersionState.SERVING):
        if version.state in (VersionState.STAGED, VersionState.WARMING):
            version = await registry.set_version_state(model, DEV_VERSION, state, actor=ACTOR)
    if await registry.get_route(model) is None:
        await registry.set_route(model, {DEV_VERSION: 10_000}, actor=ACTOR)
    # A new tritonserver process: verified afresh by the control plane's health checks before it is ready.
    await registry.register_replica(
        DEV_REPLICA_ID, endpoint=endpoint, model=model, version=DEV_VERSION, actor=ACTOR,
        state=ReplicaState.STARTING, detail="started by make run; not checked yet", metrics_url=metrics_url,
    )  # fmt: skip
    route = await registry.get_route(model)
    split = ", ".join(f"{e.version} {e.weight_bp / 100:g}%" for e in route.entries) if route else "none"
    log.info(
        "registry: %s version %s (%s) %s, route %s; replica %s at %s registered, to be verified",
        model, DEV_VERSION, digest, version.state, split, DEV_REPLICA_ID, endpoint,
    )  # fmt: skip


async def _on_registry(settings: Settings, action: Callable[[Registry], Awaitable[object]]) -> None:
    """``action`` on the registry settings name (opened for it, then closed)."""
    registry = await open_registry(settings)
    try:
        await action(registry)
    finally:
        await registry.close()


class ControlPlaneProcess:
    """``python -m control_plane.service`` as a child in its own session (we relay the stop), which the
    kernel SIGTERMs if we die; its log goes to our stderr."""

    def __init__(self, settings: Settings) -> None:
        self.url = f"http://{settings.control_plane_host}:{settings.control_plane_port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.service"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + CONTROL_PLANE_START_TIMEOUT_S
        while not _answers(f"{self.url}/healthz"):
            code = self._proc.poll()
            if code is not None:
                raise DevStackError(f"the control plane exited with {code} at start (its log is above)")
            if time.monotonic() > deadline:
                raise DevStackError(f"the control plane did not answer on {self.url} within 30 s")
            time.sleep(0.2)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(CONTROL_PLANE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # it and any replica it started
            proc.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _announce_when_ready(base_url: str, text: str) -> None:
    """Print the banner once the gateway routes the dev model (its /readyz answers 200: a registry snapshot
    read and local-1 verified by the control plane), so the curl it shows works the moment it shows. It
    was printed before the gateway listened: the first requests were refused, then 503 for a second or
    two. Said once if that takes longer than ``READY_TIMEOUT_S``; printed whenever it comes."""
    deadline: float | None = time.monotonic() + READY_TIMEOUT_S
    while not _answers(f"{base_url}/readyz"):
        if deadline is not None and time.monotonic() > deadline:
            log.warning(
                "the gateway is not ready %g s after start (the lines above say why); waiting",
                READY_TIMEOUT_S,
            )
            deadline = None
        time.sleep(0.1)
    print(text, file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if we die (as ``replicas.launcher`` does for Triton)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-repository", type=Path, default=Path(".sluice/model_repository"))
    ap.add_argument("--triton-http-port", type=int, default=8000)
    args = ap.parse_args(argv)
    configure_logging(service="gateway")
    try:
        settings = load_settings(routing="registry", engine_client="triton")
        admin_token = prepare_dev_admin_token(settings)
    except (SettingsError, AdminTokenStoreUnavailable) as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, SettingsError) else 1
    grpc_port = int(settings.triton_grpc_url.rsplit(":", 1)[1])
    metrics_port = int(settings.triton_metrics_url.rsplit(":", 1)[1].split("/", 1)[0])
    triton = TritonServer(
        TritonServerConfig(
            model_repository=args.model_repository,
            http_port=args.triton_http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            state_dir=settings.state_dir / "triton",
        )
    )
    return run_in_foreground(triton, lambda: _while_up(settings, triton, admin_token))


def _while_up(settings: Settings, triton: TritonServer, admin_token: str | None) -> int:
    """With Triton up: register, start the control plane, serve the gateway until it ends."""
    control_plane = ControlPlaneProcess(settings)
    try:
        model, checkpoint_dir = settings.model_name, settings.checkpoint_dir
        grpc_url, metrics_url = triton.grpc_url, triton.metrics_url
        asyncio.run(
            _on_registry(
                settings,
                lambda r: register_dev_model(r, model, checkpoint_dir, grpc_url, metrics_url=metrics_url),
            )
        )
        control_plane.start()
        base_url = f"http://{settings.gateway_host}:{settings.gateway_port}"
        text = banner(base_url, settings.model_name, settings.dev_tenants, control_plane.url, admin_token)
        threading.Thread(target=_announce_when_ready, args=(base_url, text), daemon=True).start()
        # uvicorn's own start-up lines would repeat the banner: only its warnings and errors.
        serve(create_app(settings), settings, uvicorn_log_level="warning")
        return 0
    except (DevStackError, RegistryError, OSError) as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 1
    finally:
        control_plane.stop()
        with contextlib.suppress(RegistryError, OSError):
            asyncio.run(_on_registry(settings, lambda r: r.remove_replica(DEV_REPLICA_ID, actor=ACTOR)))


if __name__ == "__main__":
    sys.exit(main())
