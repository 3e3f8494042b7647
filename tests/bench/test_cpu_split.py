"""The CPU split the side-by-side benchmark reports: naming a stack's processes, the per-token arithmetic,
the bound a served share puts on CPU per token, and the meter on a real process that burns CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bench.cpu_split import (
    CLIENT,
    CpuMeter,
    CpuSplit,
    named_threads_cpu_s,
    part_of,
    share_bound_us_per_token,
    share_ceiling,
    split_parts,
)
from bench.servers import proc_id
from bench.side_by_side import ENGINE, SLUICE, RunResult, cpu_table, serving_path_lines, share_bound_lines
from cpu_engine.thread_names import ENGINE_THREAD

STUB = "/w/.sluice/triton/backends/python/triton_python_backend_stub"


@pytest.mark.parametrize(
    ("cmdline", "part"),
    [
        (
            f"{STUB} /w/.sluice/model_repository/sluice-tiny/1/model.py sluice_1_8000 1048576",
            "Python backend: sluice-tiny",
        ),
        (f"{STUB} /w/.sluice/model_repository/sluice-guard/1/model.py x", "Python backend: sluice-guard"),
        (
            "/w/site-packages/pytriton/tritonserver/bin/tritonserver --model-repository x",
            "tritonserver",
        ),
        ("/w/.venv/bin/python -m gateway.devstack --model-repository x", "gateway"),
        ("/w/.venv/bin/python -m control_plane.service", "control plane"),
        (
            "/tmp/vllm-anchor/venv/bin/python /tmp/vllm-anchor/venv/bin/vllm serve /m --port 8011",
            "vLLM server",
        ),
        ("/usr/bin/redis-server *:6379", "redis-server"),
        ("", "?"),
    ],
)
def test_a_stacks_processes_are_named_by_the_part_they_play(cmdline: str, part: str) -> None:
    assert part_of(cmdline) == part


def test_a_split_reads_cores_and_microseconds_per_token() -> None:
    split = CpuSplit(wall_s=2.0, cpu_s={"gateway": 1.0, CLIENT: 0.5}, output_tokens=5_000)
    assert split.cores("gateway") == pytest.approx(0.5)
    assert split.us_per_token("gateway") == pytest.approx(200.0)
    assert split.us_per_token("absent") == 0.0
    assert split.total_us_per_token == pytest.approx(300.0)


def test_the_share_bound_and_the_ceiling_are_each_others_inverse() -> None:
    # 2 cores, an engine alone at 8,000 tok/s: 75% is 6,000 tok/s, i.e. 333 us of CPU per token at most.
    allowed = share_bound_us_per_token(2, 8_000, 0.75)
    assert allowed == pytest.approx(1e6 * 2 / 6_000)
    assert share_ceiling(2, allowed, 8_000) == pytest.approx(0.75)
    assert share_ceiling(2, 2 * allowed, 8_000) == pytest.approx(0.375)
    with pytest.raises(ValueError):
        share_bound_us_per_token(2, 0, 0.75)
    with pytest.raises(ValueError):
        share_ceiling(2, 0, 8_000)


def _run(target: str, tokens_per_s: float, cpu: CpuSplit) -> RunResult:
    return RunResult(target, 32, 0, tokens_per_s, *([1.0] * 7), cpu=cpu)


def test_the_cpu_table_and_the_bound_line_read_the_medians_of_the_runs() -> None:
    results = [
        _run(SLUICE, 2_000, CpuSplit(10.0, {"gateway": 4.0, CLIENT: 2.0, "engine": 8.0}, 20_000, 10_000)),
        _run(SLUICE, 2_000, CpuSplit(10.0, {"gateway": 6.0, CLIENT: 2.0, "engine": 8.0}, 20_000, 5_000)),
        _run(ENGINE, 8_000, CpuSplit(2.0, {"engine (this process)": 3.2}, 16_000)),
    ]
    table = cpu_table(results, 32)
    # per token: the median of 200 and 300 us; per chunk: of 400 (10,000 chunks) and 1,200 (5,000)
    assert "| Sluice (safety none) | gateway | 0.50 | 250 | 800 |" in table
    # 2 and 4 tokens a chunk; 1,400 and 3,200 us a chunk for all parts
    assert "| Sluice (safety none) | **all** (3.00 tokens a chunk) | 1.50 | 750 | 2,300 |" in table
    assert "| engine alone | engine (this process) | 1.60 | 200 | - |" in table  # no chunks counted
    assert "| engine alone | **all** | 1.60 | 200 | - |" in table
    assert cpu_table(results, 1) == ""
    (line,) = share_bound_lines(results, 32, num_cores=2)
    # 75% of 8,000 tok/s on 2 cores leaves 333 us a token; 750 us a token buys at most 2e6/750/8000 = 33%.
    assert "leaves 333 µs" in line and "spent 750" in line and "by itself, 200" in line
    assert "at most 33% of the engine-alone" in line
    assert share_bound_lines(results[:2], 32, num_cores=2) == []  # no engine-alone run: nothing to bound


def test_the_meter_counts_a_servers_descendants_and_this_process() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(30)"
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"]
    )
    try:
        root = proc_id(parent.pid)
        assert root is not None
        meter = CpuMeter({"server": root})
        meter.start()
        began = time.process_time()
        while time.process_time() - began < 0.2:  # this process: the client
            pass
        time.sleep(1.5)  # the grandchild's 0.4 s of CPU falls inside the window
        split = meter.stop(output_tokens=1_000)
    finally:
        parent.kill()
        parent.wait()
    assert split.cpu_s[CLIENT] >= 0.19
    python_part = part_of(sys.executable)
    assert split.cpu_s[python_part] >= 0.3  # the grandchild's burn (less its start-up before the window)
    assert split.wall_s >= 1.5


def test_a_part_idle_through_the_runs_is_left_out_of_the_table() -> None:
    split = CpuSplit(10.0, {"gateway": 2.0, "Python backend: sluice-guard": 0.0, CLIENT: 1.0}, 10_000)
    table = cpu_table([_run(SLUICE, 1_000, split)], 32)
    assert "sluice-guard" not in table and "| Sluice (safety none) | gateway | 0.20 | 200 | - |" in table


def test_an_engine_models_process_is_two_parts_and_any_other_one() -> None:
    backend = "Python backend: sluice-tiny"
    assert split_parts(backend, 3.0, 2.5) == {
        f"{backend}, engine thread": 2.5,
        f"{backend}, other threads": pytest.approx(0.5),
    }
    assert split_parts(backend, 3.0, None) == {backend: 3.0}  # no thread named by an engine
    assert split_parts("gateway", 3.0, 2.5) == {"gateway": 3.0}  # only a Python backend holds an engine


def test_the_cpu_of_threads_named_by_the_engine_is_read_from_proc() -> None:
    done, burnt = threading.Event(), threading.Event()

    def engine_like() -> None:
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(ENGINE_THREAD)
        began = time.thread_time()
        while time.thread_time() - began < 0.3:
            pass
        burnt.set()
        done.wait(30)

    thread = threading.Thread(target=engine_like)
    thread.start()
    try:
        assert burnt.wait(30)
        assert named_threads_cpu_s(os.getpid(), ENGINE_THREAD) >= 0.27  # /proc counts in 10 ms ticks
        assert named_threads_cpu_s(os.getpid(), "no-such-thread") is None
    finally:
        done.set()
        thread.join(10)


_BACKEND = """
    import threading, time
    from pathlib import Path

    def burn(seconds):
        began = time.thread_time()
        while time.thread_time() - began < seconds:
            pass

    def engine():
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text("sluice-engine")
        time.sleep(0.5)
        burn(0.6)
        Path(__file__).with_name("engine-done").touch()
        time.sleep(60)

    threading.Thread(target=engine, daemon=True).start()
    time.sleep(0.5)
    burn(0.3)
    Path(__file__).with_name("main-done").touch()
    time.sleep(60)
"""


def test_the_meter_splits_an_engine_models_process_by_its_threads(tmp_path: Path) -> None:
    """A process that looks like the engine model's Triton stub (by its command line) and burns CPU in
    a thread named as the engine names its own, and in another: two parts, each with its own CPU."""
    stub = tmp_path / "triton_python_backend_stub"
    stub.symlink_to(sys.executable)
    model = tmp_path / "sluice-tiny" / "1" / "model.py"
    model.parent.mkdir(parents=True)
    model.write_text(textwrap.dedent(_BACKEND))
    proc = subprocess.Popen([str(stub), str(model)])
    try:
        time.sleep(0.3)  # started and named, not burning yet
        root = proc_id(proc.pid)
        assert root is not None
        meter = CpuMeter({"sluice": root})
        meter.start()
        deadline = time.monotonic() + 30
        while not all((model.parent / done).exists() for done in ("engine-done", "main-done")):
            assert time.monotonic() < deadline, "the burns did not end"
            time.sleep(0.05)
        time.sleep(0.1)  # the ticks of the burns' ends
        split = meter.stop(output_tokens=1_000)
    finally:
        proc.kill()
        proc.wait()
    engine = split.cpu_s["Python backend: sluice-tiny, engine thread"]
    other = split.cpu_s["Python backend: sluice-tiny, other threads"]
    assert 0.5 <= engine <= 0.8, split.cpu_s
    assert 0.2 <= other <= 0.5, split.cpu_s
    assert "Python backend: sluice-tiny" not in split.cpu_s


def test_the_serving_path_line_adds_the_gateway_tritonserver_and_the_engine_models_other_threads() -> None:
    backend = "Python backend: sluice-tiny"

    def split(gateway_s: float) -> CpuSplit:
        cpu_s = {
            "gateway": gateway_s,
            "tritonserver": 0.5,
            f"{backend}, engine thread": 2.0,
            f"{backend}, other threads": 0.5,
            CLIENT: 1.0,
        }
        return CpuSplit(10.0, cpu_s, 20_000, 5_000)

    results = [
        _run(SLUICE, 2_000, split(1.0)),
        _run(SLUICE, 2_000, split(2.0)),
        _run(SLUICE, 2_000, split(3.0)),
    ]
    (line,) = serving_path_lines(results, 32)
    # per token: gateway 50/100/150 -> median 100; tritonserver 25; other threads 25; total median 150
    assert "gateway 100 + tritonserver 25 + the engine model's other threads 25 = 150 µs: not met" in line
    assert "the engine thread 100, the client 50" in line
    cheap = [_run(SLUICE, 2_000, split(0.2))]
    assert serving_path_lines(cheap, 32)[0].count(": met") == 1  # 10 + 25 + 25 = 60 <= 120
    whole = CpuSplit(10.0, {"gateway": 1.0, backend: 2.5, CLIENT: 1.0}, 20_000)
    assert serving_path_lines([_run(SLUICE, 2_000, whole)], 32) == []  # threads not told apart
