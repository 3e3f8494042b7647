"""Start and stop the two servers the side-by-side benchmark compares, leaving nothing behind.

- ``SluiceStack``: ``python -m gateway.devstack`` (what ``make run`` runs: tritonserver on 8000-8002, the
  gateway on 8080, dev tenants on), in its own session; stopped by SIGINT, as Ctrl-C stops ``make run``,
  which stops its tritonserver. Given a state directory of its own, its tenants (``put_tenant``, before
  ``start``), SQLite file and telemetry are the benchmark's, not the developer's ``.sluice``.
- ``VllmServer``: vLLM's CPU build through ../shared/anchors/vllm-cpu/ (``install.sh`` once per machine,
  ``serve.sh`` to start; it writes ``DIR/server.pid``); stopped by SIGTERM to that pid.

Both ``stop()``s take a snapshot of the server's process tree first, and after the polite signal and a
grace period SIGKILL whatever of that tree is still alive (a process is named by pid AND start time, so a
reused pid is never hit). ``stop()`` is idempotent and returns the processes that had to be killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from sluice.domain import Tenant
from sluice.settings import Settings
from sluice.stores.openers import open_tenant_store

ProcId = tuple[int, int]  # (pid, start time in clock ticks since boot)

REPO_ROOT = Path(__file__).resolve().parent.parent
ANCHOR_DIR = REPO_ROOT.parent / "shared" / "anchors" / "vllm-cpu"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from the field after the command name (state is [0], ppid [1], start time [19])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def proc_id(pid: int) -> ProcId | None:
    fields = _stat_fields(pid)
    return None if fields is None else (pid, int(fields[19]))


def is_alive(proc: ProcId) -> bool:
    """True while that very process (not a later one with its pid) exists and is not a zombie."""
    fields = _stat_fields(proc[0])
    return fields is not None and int(fields[19]) == proc[1] and fields[0] != "Z"


def process_tree(root: ProcId) -> list[ProcId]:
    """``root`` (if still alive) and its descendants, then the members of its session (a server started
    with setsid whose children outlived it); every one alive now."""
    children: dict[int, list[int]] = {}
    session: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            if int(fields[3]) == root[0]:
                session.append(int(entry.name))
    pids: list[int] = []
    frontier = [root[0]] if is_alive(root) else []
    while frontier:
        pid = frontier.pop(0)
        pids.append(pid)
        frontier.extend(children.get(pid, []))
    pids.extend(p for p in session if p not in pids)
    return [p for p in map(proc_id, pids) if p is not None and is_alive(p)]


def wait_gone(procs: list[ProcId], timeout_s: float) -> list[ProcId]:
    """Wait up to ``timeout_s`` for every process to exit; those still alive."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in procs if is_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def stop_tree(root: ProcId, sig: signal.Signals, grace_s: float, reap: Callable[[], object]) -> list[ProcId]:
    """Send ``sig`` to ``root``, wait ``grace_s`` for it and everything in its tree (taken before the
    signal) to exit, then SIGKILL what is left. ``reap`` collects the root's exit status if it is our
    child. Returns the processes that had to be killed."""
    procs = process_tree(root)
    if is_alive(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(root[0], sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_alive(p) for p in procs):
        reap()
        time.sleep(0.1)
    killed = [p for p in procs if is_alive(p)]
    for pid, _ in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reap()
    wait_gone(killed, 5.0)
    return killed


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def http_text(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def _echo_install_output(proc: subprocess.Popen[str]) -> None:
    """Relay install.sh's output, less pip's warning about each absent local index (one per package)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if not line.startswith("WARNING: Location "):
            sys.stderr.write(line)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat's first line: user, nice,
    system, irq, softirq, steal; not idle or iowait)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


QUIET_TIMEOUT_S = 10.0  # the longest a run waits for a quiet machine


def wait_until_quiet(
    *,
    busy_below_cores: float = 0.25,
    window_s: float = 0.25,
    timeout_s: float = QUIET_TIMEOUT_S,
    read_busy_s: Callable[[], float] = busy_cpu_s,
    sleep: Callable[[float], object] = time.sleep,
) -> float | None:
    """Wait until the machine is quiet: a ``window_s`` in which all its processes together kept fewer than
    ``busy_below_cores`` cores busy. Returns the seconds waited, or None if it was not quiet within
    ``timeout_s`` (then the run goes ahead; the caller says so).

    Why: a server keeps working after its last response (vLLM's CPU engine spins a core for ~1 s; seen on
    a 2-core EPYC), and in an alternating side-by-side the next target's run would start on the cores
    that work still holds: its first wave pays for the other server's tail."""
    waited_s = 0.0
    before = read_busy_s()
    while waited_s < timeout_s:
        sleep(window_s)
        waited_s += window_s
        after = read_busy_s()
        if (after - before) / window_s < busy_below_cores:
            return waited_s
        before = after
    return None


def start_when_quiet(busy_below_cores: float) -> None:
    """``wait_until_quiet`` before a run (``busy_below_cores`` 0: at once), saying so when it was not."""
    if busy_below_cores > 0 and wait_until_quiet(busy_below_cores=busy_below_cores) is None:
        waited = f"{QUIET_TIMEOUT_S:g} s"
        log(f"the machine kept {busy_below_cores:g} cores or more busy for {waited}: the run starts anyway")


@dataclass(frozen=True)
class StackPorts:
    """The five ports of a dev stack. ``make run``'s fixed ones by default; ``free()`` for a stack that
    must not collide with one already running (e.g. ``make run`` or another engineer's tests)."""

    gateway: int = 8080
    control_plane: int = 8090
    triton_http: int = 8000
    triton_grpc: int = 8001
    triton_metrics: int = 8002

    @classmethod
    def free(cls) -> StackPorts:
        """Ports the kernel says are free now (held open together, so they are distinct)."""
        with ExitStack() as stack:
            socks = [stack.enter_context(socket.socket()) for _ in range(5)]
            for sock in socks:
                sock.bind(("127.0.0.1", 0))
            return cls(*(int(sock.getsockname()[1]) for sock in socks))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.triton_grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.triton_metrics}/metrics"

    def env(self) -> dict[str, str]:
        """The settings that put devstack's gateway, control plane and replica on these ports."""
        return {
            "SLUICE_GATEWAY_PORT": str(self.gateway),
            "SLUICE_CONTROL_PLANE_PORT": str(self.control_plane),
            "SLUICE_TRITON_GRPC_URL": self.grpc_url,
            "SLUICE_TRITON_METRICS_URL": self.metrics_url,
        }


class SluiceStack:
    """``python -m gateway.devstack`` over ``model_repository``; ``start()`` returns once /readyz is 200.

    With ``state_dir`` (and the ``checkpoint_dir`` the gateway tokenizes with), the stack keeps its state
    there (``SLUICE_STATE_DIR``); without, in the default ``.sluice`` as ``make run`` does. With ``ports``,
    it serves on those (``base_url`` is then ignored: the gateway's own); without, on ``make run``'s.
    ``env``: settings for this stack alone (``SLUICE_...`` variables, or the engine's ``OMP_NUM_THREADS``),
    over the caller's environment."""

    def __init__(
        self,
        model_repository: Path,
        base_url: str,
        log_path: Path,
        ready_timeout_s: float = 240.0,
        state_dir: Path | None = None,
        checkpoint_dir: Path | None = None,
        ports: StackPorts | None = None,
        env: dict[str, str] | None = None,
    ):
        self.model_repository = model_repository
        self.env = dict(env or {})
        self.ports = ports
        self.base_url = ports.base_url if ports is not None else base_url  # http://host:port, no /v1
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.state_dir = state_dir.resolve() if state_dir is not None else None
        self.checkpoint_dir = checkpoint_dir.resolve() if checkpoint_dir is not None else None
        self._proc: subprocess.Popen[bytes] | None = None

    def _state_env(self) -> dict[str, str]:
        env = {} if self.state_dir is None else {"SLUICE_STATE_DIR": str(self.state_dir)}
        if self.checkpoint_dir is not None:
            env["SLUICE_CHECKPOINT_DIR"] = str(self.checkpoint_dir)
        if self.ports is not None:
            env.update(self.ports.env())
        return env

    def put_tenant(self, tenant: Tenant, api_key: str) -> None:
        """Write ``tenant`` (replacing one of that id) with ``api_key`` into the store the stack will use:
        the same store ``sluice tenants`` opens with this stack's environment. Call before ``start``."""
        overrides: dict[str, object] = {}
        if self.state_dir is not None:
            overrides["state_dir"] = self.state_dir
        if self.checkpoint_dir is not None:
            overrides["checkpoint_dir"] = self.checkpoint_dir

        async def put() -> None:
            store = await open_tenant_store(Settings(**overrides))
            try:
                await store.put_tenant(tenant)
                await store.add_key(tenant.tenant_id, api_key)
            finally:
                await store.close()

        asyncio.run(put())

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SLUICE_DEV_TENANTS": "true", **self._state_env(), **self.env}
        with self.log_path.open("wb") as out:
            # NOTE: its own session, so a Ctrl-C at the terminal reaches only us; our finally stops it once.
            http_port = [] if self.ports is None else ["--triton-http-port", str(self.ports.triton_http)]
            command = ["-m", "gateway.devstack", "--model-repository", str(self.model_repository), *http_port]
            self._proc = subprocess.Popen(
                [sys.executable, *command],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        log(f"Sluice stack starting (pid {self._proc.pid}, log {self.log_path})")
        deadline = time.monotonic() + self.ready_timeout_s
        while not http_ok(f"{self.base_url}/readyz"):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Sluice stack did not become ready:\n{self.log_tail()}")
            time.sleep(0.5)
        log(f"Sluice ready on {self.base_url}/v1")

    @property
    def root(self) -> ProcId | None:
        """The devstack process (gateway; tritonserver and its models are in its tree) while it runs."""
        return proc_id(self._proc.pid) if self._proc is not None and self._proc.poll() is None else None

    def log_tail(self, num_lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        return ""

    def stop(self) -> list[ProcId]:
        """SIGINT (devstack stops its tritonserver), then SIGKILL whatever is left after 45 s."""
        proc, self._proc = self._proc, None
        if proc is None:
            return []
        # Not yet reaped (returncode None), our child's pid cannot have been reused.
        root = proc_id(proc.pid) if proc.returncode is None else None
        killed = stop_tree(root, signal.SIGINT, 45.0, proc.poll) if root is not None else []
        proc.wait()
        log(f"Sluice stack stopped{f'; had to kill {killed}' if killed else ''}")
        return killed


class VllmServer:
    """vLLM's CPU build serving ``checkpoint`` on ``port``, installed into and run from ``vllm_dir``."""

    def __init__(self, vllm_dir: Path, checkpoint: Path, port: int, anchor_dir: Path = ANCHOR_DIR):
        self.vllm_dir = vllm_dir
        self.checkpoint = checkpoint
        self.port = port
        self.anchor_dir = anchor_dir
        self._root: ProcId | None = None

    @property
    def pid_file(self) -> Path:
        return self.vllm_dir / "server.pid"

    def ensure_installed(self) -> None:
        """Run the anchor's install.sh unless ``vllm_dir/venv`` holds vLLM already (~80 s, ~3.4 GiB)."""
        if (self.vllm_dir / "venv" / "bin" / "vllm").exists():
            return
        log(f"installing vLLM's CPU build into {self.vllm_dir} (once per machine: ~80 s, ~3.4 GiB)")
        began = time.monotonic()
        proc = subprocess.Popen(
            ["bash", str(self.anchor_dir / "install.sh"), str(self.vllm_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        echo = threading.Thread(target=_echo_install_output, args=(proc,), daemon=True)
        echo.start()
        try:
            while proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=15)
                if proc.returncode is None:
                    log(f"... still installing vLLM ({time.monotonic() - began:.0f} s)")
        finally:
            if proc.poll() is None:  # interrupted: do not leave pip running
                proc.terminate()
                proc.wait()
            echo.join(timeout=5)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM's install.sh failed with exit status {proc.returncode}")
        log(f"vLLM installed in {time.monotonic() - began:.0f} s")

    def start(self) -> None:
        """serve.sh: returns once /health answers (40-80 s: the first start compiles)."""
        self.pid_file.unlink(missing_ok=True)  # the port was checked free: any old pid is not a live server
        log(f"vLLM starting on port {self.port} (40-80 s; log {self.vllm_dir / 'server.log'})")
        began = time.monotonic()
        try:
            subprocess.run(
                [
                    "bash",
                    str(self.anchor_dir / "serve.sh"),
                    str(self.vllm_dir),
                    str(self.checkpoint),
                    str(self.port),
                ],
                check=True,
                timeout=330,
            )
        finally:
            # Whatever serve.sh ended with, the server it started is ours to stop.
            with contextlib.suppress(OSError, ValueError):
                self._root = proc_id(int(self.pid_file.read_text().strip()))
        log(f"vLLM ready in {time.monotonic() - began:.0f} s")

    @property
    def root(self) -> ProcId | None:
        """serve.sh's server process (its engine core is in its tree) while started."""
        return self._root

    def version(self) -> str:
        import json

        return str(json.loads(http_text(f"http://127.0.0.1:{self.port}/version")).get("version", "?"))

    def stop(self) -> list[ProcId]:
        """SIGTERM to serve.sh's pid, as the anchor's README does; SIGKILL its tree after 30 s."""
        root, self._root = self._root, None
        if root is None:
            return []
        killed = stop_tree(root, signal.SIGTERM, 30.0, lambda: None)
        log(f"vLLM stopped{f'; had to kill {killed}' if killed else ''}")
        return killed
