"""The launcher: failures surface Triton's log, nothing is left running, the CLI stops on Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from proc_table import processes_mentioning

from replicas.launcher import (
    TritonInstall,
    TritonLaunchError,
    TritonServer,
    TritonServerConfig,
    engine_omp_threads,
    engine_team,
    server_env,
)
from replicas.render import CpuEngineModelSettings, render_model_repository


def start_cli(
    model_repository: Path, state_dir: Path, ports: list[int], prefix: str
) -> subprocess.Popen[str]:
    """``python -m replicas.launcher`` on these ports, returned once it says the server is ready."""
    http, grpc, metrics = ports
    cli = subprocess.Popen(
        [
            sys.executable, "-m", "replicas.launcher",
            "--model-repository", str(model_repository), "--state-dir", str(state_dir),
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
            "--shm-prefix", prefix,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert cli.stderr is not None
    deadline = time.monotonic() + 60
    for line in cli.stderr:
        if line.startswith("tritonserver ready") or time.monotonic() > deadline:
            break
    return cli


def test_stop_leaves_no_process_behind(start_replica: Callable[[str], TritonServer]) -> None:
    server = start_replica("stopcheck")
    prefix = server.config.effective_shm_prefix
    pid = server.pid
    assert pid is not None and len(processes_mentioning(prefix)) >= 2  # the server and its backend stub
    server.stop()
    assert processes_mentioning(prefix) == []
    assert list(Path("/dev/shm").glob(f"{prefix}*")) == []  # nor a shared-memory region
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    server.stop()  # idempotent


def test_a_model_that_fails_to_load_surfaces_the_log(tmp_path: Path, three_free_ports: list[int]) -> None:
    repo = tmp_path / "repo"
    absent = tmp_path / "no-such-checkpoint"  # with a digest given, rendering does not read the checkpoint
    render_model_repository(
        repo, CpuEngineModelSettings(checkpoint_dir=absent, weights_digest="sha256:" + "0" * 64)
    )
    http, grpc, metrics = three_free_ports
    prefix = f"sluice_fail_{os.getpid()}_"
    config = TritonServerConfig(
        model_repository=repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        state_dir=tmp_path / "state",
        shm_prefix=prefix,
    )
    server = TritonServer(config)
    with pytest.raises(TritonLaunchError) as info:
        server.start()
    assert "no-such-checkpoint" in str(info.value)  # the model's own error, from Triton's log
    assert not server.is_running() and processes_mentioning(prefix) == []


def test_a_model_whose_weights_are_not_the_configured_digest_does_not_load(
    tmp_path: Path, three_free_ports: list[int], dev_checkpoint: Path
) -> None:
    repo = tmp_path / "repo"
    other = "sha256:" + "1" * 64  # what the registry says, not what the checkpoint holds
    render_model_repository(repo, CpuEngineModelSettings(checkpoint_dir=dev_checkpoint, weights_digest=other))
    http, grpc, metrics = three_free_ports
    config = TritonServerConfig(
        model_repository=repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        state_dir=tmp_path / "state",
        shm_prefix=f"sluice_digest_{os.getpid()}_",
    )
    with pytest.raises(TritonLaunchError, match="refusing to load"):
        TritonServer(config).start()


def test_a_taken_port_is_refused_before_launch(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = TritonServerConfig(model_repository=tmp_path, http_port=port, grpc_port=port + 1)
        with pytest.raises(TritonLaunchError, match=f"port 127.0.0.1:{port} is already in use"):
            TritonServer(config).start()


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="distinct"):
        TritonServerConfig(model_repository=Path("."), http_port=9000, grpc_port=9000)
    with pytest.raises(ValueError, match="shm_prefix"):
        TritonServerConfig(model_repository=Path("."), shm_prefix="a/b")


def test_cli_runs_until_interrupted(
    model_repository: Path, tmp_path: Path, three_free_ports: list[int]
) -> None:
    http = three_free_ports[0]
    prefix = f"sluice_cli_{os.getpid()}_"
    cli = start_cli(model_repository, tmp_path / "state", three_free_ports, prefix)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=5) as resp:
            assert resp.status == 200
        cli.send_signal(signal.SIGINT)
        assert cli.wait(timeout=20) == 130
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert processes_mentioning(prefix) == []


def test_a_launcher_killed_outright_takes_its_server_with_it(
    model_repository: Path, tmp_path: Path, three_free_ports: list[int]
) -> None:
    prefix = f"sluice_orphan_{os.getpid()}_"
    cli = start_cli(model_repository, tmp_path / "state", three_free_ports, prefix)
    try:
        assert processes_mentioning(prefix), "the server should be running"
        cli.kill()  # SIGKILL: no finally runs in the launcher
        cli.wait()
        deadline = time.monotonic() + 15
        while processes_mentioning(prefix) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(prefix) == []
    finally:
        for pid in processes_mentioning(prefix):
            os.kill(pid, signal.SIGKILL)


def test_the_engine_leaves_one_core_to_the_rest_of_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    # Measured on 2 cores at 32 streams: one OpenMP thread for the engine, not two, served more tokens/s
    # through the whole stack with a shorter p99 (the sender, tritonserver and the gateway need a core).
    install = TritonInstall.from_wheel()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert engine_omp_threads(2) == 1 and engine_omp_threads(1) == 1 and engine_omp_threads(16) == 15
    assert server_env(install)["OMP_NUM_THREADS"] == str(engine_omp_threads(len(os.sched_getaffinity(0))))
    assert server_env(install, engine_num_threads=3)["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # an operator's explicit choice wins
    assert server_env(install, engine_num_threads=3)["OMP_NUM_THREADS"] == "7"
    with pytest.raises(ValueError, match="engine_num_threads"):
        TritonServerConfig(model_repository=Path("."), engine_num_threads=0)


def test_the_engine_team_is_read_as_the_server_gets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # What bench.e2e_side_by_side runs the engine alone on to compare with a replica it started.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert engine_team({}) == engine_omp_threads(cores)
    assert engine_team({}, engine_num_threads=3) == 3
    assert engine_team({"OMP_NUM_THREADS": "7"}, engine_num_threads=3) == 7
    assert engine_team({"OMP_NUM_THREADS": "4,2"}) == 4  # nested levels: the first is the team
    # Not a team size: as if unset (OpenMP ignores it too).
    for not_a_size in ("many", "0", ""):
        assert engine_team({"OMP_NUM_THREADS": not_a_size}) == engine_omp_threads(cores)
    install = TritonInstall.from_wheel()
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert server_env(install, engine_num_threads=3)["OMP_NUM_THREADS"] == "3"
