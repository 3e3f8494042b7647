"""Start and stop a real ``tritonserver`` from the nvidia-pytriton wheel.

The wheel bundles Triton 2.51 with only the Python backend, and keeps one backend stub per Python
version apart from the backend itself. ``TritonServer`` assembles a backend folder under a state folder
(backend library, ``triton_python_backend_utils.py`` and the stub for this interpreter), points the
dynamic loader and PATH at this interpreter, and runs the binary in its own process group on loopback:

    with TritonServer(TritonServerConfig(model_repository=Path(".sluice/model_repository"))) as server:
        ...  # ready: every model loaded (HTTP /v2/health/ready) and the metrics port answering

``stop()`` sends SIGTERM, then SIGKILLs the whole process group (server and backend stubs) after
``stop_timeout_s``, and unlinks the server's shared-memory regions; servers still running when the
interpreter exits are stopped by an atexit hook.
``python -m replicas.launcher --model-repository DIR`` runs one in the foreground until Ctrl-C.

On a GPU node in an NGC Triton image, ``TritonServer(config, program=image_program())`` runs the image's
own ``/opt/tritonserver/bin/tritonserver`` with its backends (the TensorRT-LLM one among them) instead:
the same start, readiness and stop (``sluice trtllm-smoke``).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import ctypes
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

_SHM_PREFIX_RE = re.compile(r"^[A-Za-z0-9_]+$")
_SHM_DIR = Path("/dev/shm")


class TritonLaunchError(RuntimeError):
    """tritonserver could not be started; the message ends with the tail of its log."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel keeps the binary, its libraries, the Python backend and this interpreter's stub."""

    binary: Path
    libs_dir: Path
    backend_lib: Path
    backend_utils: Path
    stub: Path

    @classmethod
    def from_wheel(cls) -> TritonInstall:
        # find_spec, not import: importing pytriton pulls in its whole client stack.
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise TritonLaunchError("nvidia-pytriton is not installed (it provides the tritonserver binary)")
        root = Path(next(iter(spec.submodule_search_locations)))
        server = root / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        install = cls(
            binary=server / "bin" / "tritonserver",
            libs_dir=root.parent / "nvidia_pytriton.libs",
            backend_lib=server / "backends" / "python" / "libtriton_python.so",
            backend_utils=server / "backends" / "python" / "triton_python_backend_utils.py",
            stub=server / "python_backend_stubs" / version / "triton_python_backend_stub",
        )
        for path in (install.binary, install.libs_dir, install.backend_lib, install.stub):
            if not path.exists():
                raise TritonLaunchError(f"nvidia-pytriton install is incomplete for Python {version}: {path}")
        return install


@dataclass(frozen=True)
class TritonServerConfig:
    """One server's settings. Ports are on ``host``; ``shm_prefix`` must differ between live servers."""

    model_repository: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    state_dir: Path = Path(".sluice/triton")
    # Python-backend shared-memory region prefix; "" derives one from this process id and the HTTP port.
    shm_prefix: str = ""
    allow_cpu_metrics: bool = True
    ready_timeout_s: float = 60.0
    # Triton waits this long for in-flight requests after SIGTERM; stop() SIGKILLs after stop_timeout_s.
    exit_timeout_s: int = 5
    stop_timeout_s: float = 15.0
    log_verbose: int = 0
    extra_args: tuple[str, ...] = field(default=())
    # OpenMP threads of the CPU engine's kernels (OMP_NUM_THREADS of the server and its stubs); None: one
    # fewer than this process's cores (at least 1). An OMP_NUM_THREADS already in the environment wins.
    engine_num_threads: int | None = None

    def __post_init__(self) -> None:
        ports = (self.http_port, self.grpc_port, self.metrics_port)
        if len(set(ports)) != 3 or not all(0 < p < 65536 for p in ports):
            raise ValueError(f"HTTP, gRPC and metrics ports must be distinct and in 1..65535, got {ports}")
        if self.shm_prefix and not _SHM_PREFIX_RE.fullmatch(self.shm_prefix):
            raise ValueError(f"shm_prefix must match {_SHM_PREFIX_RE.pattern}, got {self.shm_prefix!r}")
        if self.stop_timeout_s <= self.exit_timeout_s:
            raise ValueError("stop_timeout_s must exceed exit_timeout_s, or Triton is killed mid-drain")
        if self.engine_num_threads is not None and self.engine_num_threads < 1:
            raise ValueError(f"engine_num_threads must be at least 1, got {self.engine_num_threads}")

    @property
    def effective_shm_prefix(self) -> str:
        return self.shm_prefix or f"sluice_{os.getpid()}_{self.http_port}_"


def prepare_backends(install: TritonInstall, state_dir: Path) -> Path:
    """Build ``state_dir/backends/python`` (backend library, utils, this Python's stub); return backends/.

    Files are replaced only when they differ, by rename, so servers already running keep their mapping.
    """
    python_dir = state_dir / "backends" / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for src in (install.backend_lib, install.backend_utils, install.stub):
        _copy_if_changed(src, python_dir / src.name)
    return python_dir.parent


def _copy_if_changed(src: Path, dst: Path) -> None:
    s = src.stat()
    if dst.exists():
        d = dst.stat()
        if (d.st_size, d.st_mtime_ns) == (s.st_size, s.st_mtime_ns):
            return
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.{threading.get_ident()}")
    shutil.copy2(src, tmp)  # keeps the mode (the stub is executable) and the mtime compared above
    os.replace(tmp, dst)


def engine_omp_threads(num_cores: int) -> int:
    """The engine's default OpenMP team: every core but one, which the serving path needs.

    NOTE: the engine's kernels keep every thread of their team busy, while a streamed token also needs
    the Python backend's sender thread, tritonserver and, on a shared machine, the gateway. Measured on
    2 cores at 32 streams through the whole stack (three sessions of 3 alternating runs each, medians):
    1 engine thread served 4-25% more tokens/s than 2, roughly halved the inter-token p99 and lowered
    the TTFT p95; the inter-token p95 did not move. A single stream lost ~7% (the engine alone is
    faster with 2, but it is not alone).
    """
    return max(1, num_cores - 1)


def server_env(install: TritonInstall, engine_num_threads: int | None = None) -> dict[str, str]:
    """The environment the server and its stubs need to run this interpreter and its packages, with
    ``OMP_NUM_THREADS`` for the engine (``engine_num_threads``, default ``engine_omp_threads``) unless
    the environment already sets it."""
    libdir = str(sysconfig.get_config_var("LIBDIR"))
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    if not (Path(libdir) / soname).is_file():
        raise TritonLaunchError(
            f"the Python backend stub needs a shared libpython; {soname or 'it'} is not in {libdir}"
        )
    env = dict(os.environ)
    # NOTE: this interpreter's libpython first, or the stub loads the system one and fails; the wheel's
    # libraries because the backend and stub are copied out of it (their RPATH no longer resolves).
    inherited = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    env["LD_LIBRARY_PATH"] = ":".join([libdir, str(install.libs_dir), *inherited])
    # The embedded interpreter finds its prefix from `python3` on PATH: this (virtual) environment's.
    env["PATH"] = f"{sysconfig.get_path('scripts')}:{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or str(engine_team(env, engine_num_threads))
    return env


def engine_team(environ: Mapping[str, str], engine_num_threads: int | None = None) -> int:
    """The OpenMP team a replica started from ``environ`` decodes on: the first level of its
    ``OMP_NUM_THREADS`` where it sets one (a number), else ``engine_num_threads``, else
    ``engine_omp_threads`` of this process's cores."""
    first_level = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first_level.isdigit() and int(first_level) >= 1:
        return int(first_level)
    return engine_num_threads or engine_omp_threads(len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class ServerProgram:
    """Which tritonserver runs: its binary, the backends folder it loads from, and its environment."""

    binary: Path
    backends_dir: Path
    env: dict[str, str]


ProgramFor = Callable[[TritonServerConfig], ServerProgram]


def wheel_program(config: TritonServerConfig) -> ServerProgram:
    """The nvidia-pytriton wheel's tritonserver with its Python backend (module docstring)."""
    install = TritonInstall.from_wheel()
    backends_dir = prepare_backends(install, Path(config.state_dir))
    return ServerProgram(install.binary, backends_dir, server_env(install, config.engine_num_threads))


IMAGE_TRITON_ROOT = Path("/opt/tritonserver")  # where NGC's Triton images install the server


def image_program(root: Path = IMAGE_TRITON_ROOT, extra_env: Mapping[str, str] | None = None) -> ProgramFor:
    """An NGC Triton image's own tritonserver and backends (``tensorrtllm``, ``python``...) under
    ``root``, in this process's environment plus ``extra_env`` (e.g. the TensorRT-LLM orchestrator mode:
    ``build_engines.replica_launch.triton_env``). A missing binary is a ``TritonLaunchError`` at start."""

    def program(config: TritonServerConfig) -> ServerProgram:
        binary = root / "bin" / "tritonserver"
        if not binary.is_file():
            raise TritonLaunchError(f"{binary} does not exist: not an NGC Triton image")
        return ServerProgram(binary, root / "backends", {**os.environ, **(extra_env or {})})

    return program


class TritonServer:
    """A tritonserver process: ``start()`` returns once it is ready, ``stop()`` leaves nothing behind.
    ``program`` chooses the binary (default: the pytriton wheel's; ``image_program()`` an NGC image's)."""

    def __init__(
        self, config: TritonServerConfig, echo_log: bool = False, program: ProgramFor = wheel_program
    ) -> None:
        self.config = config
        self._program = program
        self._echo_log = echo_log
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._log: collections.deque[str] = collections.deque(maxlen=400)

    @property
    def http_url(self) -> str:
        return f"http://{self.config.host}:{self.config.http_port}"

    @property
    def grpc_url(self) -> str:
        """host:port, as tritonclient.grpc expects it."""
        return f"{self.config.host}:{self.config.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.config.host}:{self.config.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self, program: ServerProgram) -> list[str]:
        c = self.config
        return [
            str(program.binary),
            f"--model-repository={Path(c.model_repository).resolve()}",
            f"--backend-directory={program.backends_dir.resolve()}",
            f"--backend-config=python,shm-region-prefix-name={c.effective_shm_prefix}",
            f"--http-address={c.host}",
            f"--http-port={c.http_port}",
            f"--grpc-address={c.host}",
            f"--grpc-port={c.grpc_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            f"--allow-cpu-metrics={str(c.allow_cpu_metrics).lower()}",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
            "--strict-readiness=true",
            f"--exit-timeout-secs={c.exit_timeout_s}",
            f"--log-verbose={c.log_verbose}",
            *c.extra_args,
        ]

    def start(self) -> None:
        """Launch and wait for readiness; on any failure the process is stopped and the log tail raised."""
        if self._proc is not None:
            raise RuntimeError("this server is already started")
        c = self.config
        if not Path(c.model_repository).is_dir():
            raise TritonLaunchError(f"model repository {c.model_repository} is not a directory")
        for port in (c.http_port, c.grpc_port, c.metrics_port):
            # Checked first: with a port taken, readiness could be answered by the other server.
            if not port_is_free(port, c.host):
                raise TritonLaunchError(f"port {c.host}:{port} is already in use")
        program = self._program(c)
        self._log.clear()
        self._proc = subprocess.Popen(
            self.command(program),
            env=program.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: Ctrl-C is ours to relay, and killpg reaches the stubs
            preexec_fn=die_with_parent,
        )
        _LIVE.add(self)
        self._reader = threading.Thread(target=self._read_log, name="tritonserver-log", daemon=True)
        self._reader.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        """Until HTTP /v2/health/ready answers 200 (every model loaded) and the metrics port answers."""
        assert self._proc is not None
        deadline = time.monotonic() + self.config.ready_timeout_s
        # NOTE: Triton starts its metrics service a little after reporting ready.
        pending = [f"{self.http_url}/v2/health/ready", self.metrics_url]
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise TritonLaunchError(
                    f"tritonserver exited with {code} before it was ready\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(pending[0], timeout=0.5) as resp:
                    if resp.status == 200:
                        pending.pop(0)
                        if not pending:
                            return
                        continue
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or listening and not ready (400)
            time.sleep(0.05)
        raise TritonLaunchError(
            f"tritonserver was not ready within {self.config.ready_timeout_s:.0f} s\n{self.log_tail()}"
        )

    def _read_log(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", errors="replace")
            self._log.append(line)
            if self._echo_log:
                sys.stderr.write(line)

    def log_tail(self, num_lines: int = 60) -> str:
        return "".join(list(self._log)[-num_lines:])

    def wait(self) -> int:
        """Block until the server exits on its own; its exit status."""
        if self._proc is None:
            raise RuntimeError("this server is not started")
        return self._proc.wait()

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, wait up to ``stop_timeout_s``, then SIGKILL the process group. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(self.config.stop_timeout_s)
        finally:
            # The group outlives a server that exited or hung: stubs may still be in it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if self._reader is not None:
                self._reader.join(timeout=2.0)
            self._proc = None
            _LIVE.discard(self)
            _remove_shm_regions(self.config.effective_shm_prefix)

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _remove_shm_regions(prefix: str) -> None:
    """Unlink the Python backend's shared-memory regions, which a server that exits in a hurry leaves."""
    for path in _SHM_DIR.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on ``host:port`` (it can be bound now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


_LIVE: set[TritonServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


def die_with_parent() -> None:
    """In the child before exec: SIGTERM the server if the process that started it dies.

    NOTE: without this, a launcher killed with SIGKILL (a test run cut short by a timeout) leaves its
    tritonserver running, holding ports and a core. Linux only; the signal follows the thread that
    forked, so start servers from a thread that lives as long as they should.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run tritonserver (from nvidia-pytriton) until Ctrl-C.")
    parser.add_argument("--model-repository", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--state-dir", type=Path, default=Path(".sluice/triton"))
    parser.add_argument("--shm-prefix", default="", help="Python-backend shm prefix (default: derived)")
    parser.add_argument("--log-verbose", type=int, default=0)
    args = parser.parse_args(argv)
    config = TritonServerConfig(
        model_repository=args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        state_dir=args.state_dir,
        shm_prefix=args.shm_prefix,
        log_verbose=args.log_verbose,
    )
    server = TritonServer(config, echo_log=True)

    def while_up() -> int:
        urls = f"HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {server.metrics_url}"
        print(f"tritonserver ready: {urls}", file=sys.stderr, flush=True)
        return server.wait()

    return run_in_foreground(server, while_up)


def run_in_foreground(server: TritonServer, while_up: Callable[[], int]) -> int:
    """Start ``server``, run ``while_up`` until it returns, Ctrl-C or SIGTERM; always stop the server.

    Returns ``while_up``'s exit status, 130 on Ctrl-C, 143 on SIGTERM, 1 if the server failed to start.
    """
    # SIGTERM to us ends like Ctrl-C: through the finally below, which stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # A shell starts background jobs with SIGINT ignored; Ctrl-C must still stop what we started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server.start()
        return while_up()
    except KeyboardInterrupt:
        return 130
    except TritonLaunchError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
