"""Kernel-visible names for the replica's own threads.

Python 3.11 names threads for itself only: to the kernel (``top -H``, ``ps -T``, py-spy, /proc) every
thread of a Triton Python-backend stub is ``triton_python_b``. The engine's stepping thread, the send
path's threads and the metrics thread name themselves here, so a person (or ``bench.cpu_split``) can tell
the engine's CPU from the send path's. The OpenMP workers a thread starts inherit its name (the kernel
copies it at clone), so the engine's kernel teams count as the engine.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

ENGINE_THREAD = "sluice-engine"
SENDER_THREAD = "sluice-sender"
METRICS_THREAD = "sluice-metrics"
MAX_NAME_BYTES = 15  # the kernel's limit (TASK_COMM_LEN 16, with its terminating NUL)

log = logging.getLogger(__name__)


def name_this_thread(name: str) -> bool:
    """Give the calling thread ``name`` as its kernel name; False where it could not (not Linux, or
    /proc refused: logged, the name is for people and benches, nothing depends on it to run)."""
    encoded = name.encode()
    if not encoded or len(encoded) > MAX_NAME_BYTES:
        raise ValueError(f"a thread name is 1-{MAX_NAME_BYTES} bytes, got {name!r}")
    if not sys.platform.startswith("linux"):
        return False
    comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm")
    try:
        comm.write_bytes(encoded)
    except OSError as exc:
        log.warning("could not name thread %s %r: %s", threading.get_native_id(), name, exc)
        return False
    return True
