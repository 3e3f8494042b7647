"""Wedge a real replica's engine for a test: its tritonserver stays up and ready, its port open, and no
token comes, until it is thawed.

How: the model's own threads in the Python backend's stub process (the CPU engine's thread, the sender,
the metrics thread) are stopped one by one with ptrace (PTRACE_SEIZE + PTRACE_INTERRUPT), and resumed by
detaching. The stub's own threads keep running: its main thread, its health thread and its two message
queue threads (started in that order, before the model loads; Triton 2.51's python_backend, pb_stub.cc).
NOTE: SIGSTOP of the whole stub does not do: its health thread must mark it alive every second, and
Triton 2.51 crashes (lock_exception, SIGSEGV) when a stub it waited on comes back after more than that.

The thread that freezes must be the one that thaws (ptrace's rule); a test process that dies detaches,
which thaws them too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

from proc_table import processes_mentioning

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000  # waitpid's __WALL: wait for a thread, not only a child process
# main, health, the parent-to-stub and stub-to-parent queue monitors
NUM_STUB_OWN_THREADS = 4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def backend_stub_pid(shm_prefix: str) -> int:
    """The one Python backend stub of the server started with ``shm_prefix``."""
    stubs = [
        pid
        for pid in processes_mentioning(shm_prefix)
        if "triton_python_backend_stub" in _read(Path(f"/proc/{pid}/cmdline"))
    ]
    if len(stubs) != 1:
        raise RuntimeError(f"expected one backend stub for {shm_prefix!r}, found {stubs}")
    return stubs[0]


def model_threads(stub_pid: int) -> list[int]:
    """The stub's threads that its model started: all but the stub's own first ``NUM_STUB_OWN_THREADS``."""
    tasks = []
    for entry in Path(f"/proc/{stub_pid}/task").iterdir():
        stat = _read(entry / "stat")
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        tasks.append((start_ticks, int(entry.name)))
    tasks.sort()
    threads = [tid for _, tid in tasks[NUM_STUB_OWN_THREADS:]]
    if not threads:
        raise RuntimeError(f"stub {stub_pid} has no model threads: {tasks}")
    return threads


@contextlib.contextmanager
def wedged_engine(shm_prefix: str) -> Iterator[list[int]]:
    """Freeze the model's threads of the server started with ``shm_prefix`` for the ``with`` block (the
    thread ids frozen are yielded); they resume when it ends, however it ends."""
    frozen: list[int] = []
    try:
        for tid in model_threads(backend_stub_pid(shm_prefix)):
            _ptrace(PTRACE_SEIZE, tid)
            frozen.append(tid)
            _ptrace(PTRACE_INTERRUPT, tid)
            _, status = os.waitpid(tid, WALL)
            if not os.WIFSTOPPED(status):
                raise RuntimeError(f"thread {tid} did not stop (wait status {status:#x})")
        yield frozen
    finally:
        for tid in frozen:
            with contextlib.suppress(OSError):  # a thread that exited meanwhile
                _ptrace(PTRACE_DETACH, tid)


def _ptrace(request: int, tid: int) -> None:
    if _libc.ptrace(request, tid, None, None) == -1:
        errno = ctypes.get_errno()
        raise OSError(errno, f"ptrace({request:#x}, {tid}): {os.strerror(errno)}")


def _read(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
