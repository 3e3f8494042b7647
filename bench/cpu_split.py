"""Where the machine's cores go during a run: CPU seconds of each part of a server's process tree, and of
this process (the load generator, or the engine itself when it runs alone), read from /proc and
getrusage before and after. The CPU engine's Python backend is two parts: the threads its engine named
``sluice-engine`` (the stepping thread and its OpenMP workers) and its other threads (the send path and
Triton's stub), so the serving path's CPU per token can be read without the engine's.

On a 2-core machine the client, the gateway, tritonserver and the engine share the same cores, so the
share of the engine-alone tokens/s a served stack can deliver is bounded by what its other parts cost
per token: ``share_bound`` says how much CPU per output token a given share leaves for everything, which
the benchmark sets beside what each part used.

    meter = CpuMeter({"sluice": stack_root})
    meter.start()
    ...  # the run
    split = meter.stop(output_tokens)   # CpuSplit: per part, CPU seconds, cores and microseconds per token
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.servers import ProcId, process_tree
from cpu_engine.thread_names import ENGINE_THREAD

CLIENT = "client (this process)"
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# A Python backend process that runs the CPU engine is two parts: the threads named ENGINE_THREAD (the
# stepping thread and the OpenMP workers it started) and the rest (the send path, Triton's stub threads).
ENGINE_THREADS = ", engine thread"
OTHER_THREADS = ", other threads"


def part_of(cmdline: str) -> str:
    """The part of a served stack a process is, by its command line: Sluice's gateway (``gateway.devstack``
    runs the gateway in its own process), its control plane, tritonserver, a Triton Python-backend model
    (by model name: the engine's, the safety classifier's), vLLM's processes; anything else by its
    program name."""
    argv = cmdline.split()
    if not argv:
        return "?"
    if "triton_python_backend_stub" in argv[0] and len(argv) > 1:
        model_dir = Path(argv[1]).parent.parent.name  # .../<model>/1/model.py
        return f"Python backend: {model_dir}"
    if argv[0].endswith("tritonserver"):
        return "tritonserver"
    if "gateway.devstack" in argv or "gateway" in argv:
        return "gateway"
    if "control_plane.service" in argv:
        return "control plane"
    if "vllm" in cmdline:
        return "vLLM server" if " serve " in f" {cmdline} " else "vLLM engine core"
    return Path(argv[0]).name


def _stat_cpu_s(stat_path: str) -> float | None:
    try:
        text = Path(stat_path).read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # state is [0]; utime [11], stime [12]
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of every thread of ``pid`` so far, ended ones included (None if it is
    gone)."""
    return _stat_cpu_s(f"/proc/{pid}/stat")


def named_threads_cpu_s(pid: int, name: str) -> float | None:
    """CPU seconds so far of ``pid``'s live threads whose kernel name is ``name``; None if it has none."""
    found = None
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().rstrip("\n")
        except OSError:
            continue
        if comm == name and (cpu := _stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")) is not None:
            found = (found or 0.0) + cpu
    return found


def on_serving_path(part: str) -> bool:
    """Whether a part is on the serving path issue 22 measures per token: the gateway, tritonserver and the
    engine model's threads other than its engine's (its send path, Triton's stub threads)."""
    return part in ("gateway", "tritonserver") or part.endswith(OTHER_THREADS)


def split_parts(part: str, process_s: float, engine_s: float | None) -> dict[str, float]:
    """One process's CPU seconds by part: a Python backend with an engine thread as two parts (its
    engine threads, and the rest: ``process_s`` less them), anything else whole."""
    if engine_s is None or not part.startswith("Python backend:"):
        return {part: process_s}
    return {part + ENGINE_THREADS: engine_s, part + OTHER_THREADS: process_s - engine_s}


def cmdline_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuSplit:
    """One run's CPU by part: seconds over ``wall_s``, the ``output_tokens`` it made and the ``num_chunks``
    of text the client read (0: not counted, as for the engine alone). Per token depends on how many
    tokens a chunk carries (a replica's send budget sets that); per chunk is what each message costs."""

    wall_s: float
    cpu_s: Mapping[str, float]
    output_tokens: int
    num_chunks: int = 0

    def cores(self, part: str) -> float:
        return self.cpu_s.get(part, 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    def us_per_token(self, part: str) -> float:
        return self.cpu_s.get(part, 0.0) * 1e6 / self.output_tokens if self.output_tokens else 0.0

    @property
    def total_us_per_token(self) -> float:
        return sum(self.us_per_token(p) for p in self.cpu_s)

    def us_per_chunk(self, part: str | None) -> float | None:
        """One part's (None: all parts') CPU microseconds per text chunk; None where chunks were not
        counted."""
        if not self.num_chunks:
            return None
        cpu_s = sum(self.cpu_s.values()) if part is None else self.cpu_s.get(part, 0.0)
        return cpu_s * 1e6 / self.num_chunks

    @property
    def serving_path_us_per_token(self) -> float:
        return sum(self.us_per_token(p) for p in self.cpu_s if on_serving_path(p))

    @property
    def engine_threads_us_per_token(self) -> float:
        return sum(self.us_per_token(p) for p in self.cpu_s if p.endswith(ENGINE_THREADS))

    @property
    def tokens_per_chunk(self) -> float | None:
        return self.output_tokens / self.num_chunks if self.num_chunks else None


def share_bound_us_per_token(num_cores: int, engine_alone_tokens_per_s: float, share: float) -> float:
    """The CPU per output token, all parts together (client included), at which ``num_cores`` fully
    busy serve ``share`` of the engine-alone tokens/s: spend more per token and that share cannot be
    reached on this machine, whatever the scheduling."""
    if engine_alone_tokens_per_s <= 0 or share <= 0:
        raise ValueError("engine_alone_tokens_per_s and share must be positive")
    return num_cores * 1e6 / (share * engine_alone_tokens_per_s)


def share_ceiling(num_cores: int, us_per_token: float, engine_alone_tokens_per_s: float) -> float:
    """The largest share of the engine-alone tokens/s that ``num_cores`` fully busy can serve when the
    whole served path (client included) costs ``us_per_token`` of CPU per output token."""
    if us_per_token <= 0 or engine_alone_tokens_per_s <= 0:
        raise ValueError("us_per_token and engine_alone_tokens_per_s must be positive")
    return num_cores * 1e6 / us_per_token / engine_alone_tokens_per_s


def machine_cores() -> int:
    return len(os.sched_getaffinity(0))


class CpuMeter:
    """CPU seconds per part of the given servers' process trees (each root with its descendants and
    session) and of this process, between ``start`` and ``stop``. A process that starts during the run is
    counted from zero; one that ends during it is not counted (the servers keep theirs)."""

    def __init__(self, roots: Mapping[str, ProcId]):
        self.roots = dict(roots)
        self._began: tuple[float, float, dict[int, dict[str, float]]] | None = None

    def _sample(self) -> dict[int, dict[str, float]]:
        """Per process of the trees, its CPU seconds so far by part (``split_parts``)."""
        sample: dict[int, dict[str, float]] = {}
        for root in self.roots.values():
            for pid, _ in process_tree(root):
                cpu = process_cpu_s(pid)
                if cpu is not None and pid != os.getpid():
                    sample[pid] = split_parts(
                        part_of(cmdline_of(pid)), cpu, named_threads_cpu_s(pid, ENGINE_THREAD)
                    )
        return sample

    def start(self) -> None:
        self._began = (time.monotonic(), self_cpu_s(), self._sample())

    def stop(self, output_tokens: int, num_chunks: int = 0) -> CpuSplit:
        if self._began is None:
            raise RuntimeError("CpuMeter.stop before start")
        began_s, self_before, before = self._began
        after, self_after, wall_s = self._sample(), self_cpu_s(), time.monotonic() - began_s
        cpu_s: dict[str, float] = {CLIENT: self_after - self_before}
        for pid, parts in after.items():
            for part, cpu in parts.items():
                cpu_s[part] = cpu_s.get(part, 0.0) + cpu - before.get(pid, {}).get(part, 0.0)
        self._began = None
        return CpuSplit(wall_s, cpu_s, output_tokens, num_chunks)
