"""Kernel names for the replica's threads (cpu_engine.thread_names): what /proc shows, the kernel's length
limit, and a thread started by a named one (as OpenMP starts the engine's workers) carrying its name."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from cpu_engine.thread_names import (
    ENGINE_THREAD,
    MAX_NAME_BYTES,
    METRICS_THREAD,
    SENDER_THREAD,
    name_this_thread,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel thread names: Linux")


def _comm(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().rstrip("\n")


def _in_thread(work) -> None:  # type: ignore[no-untyped-def]
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    if errors:
        raise errors[0]


def test_a_thread_that_names_itself_shows_the_name_to_the_kernel_and_its_children() -> None:
    seen: dict[str, str] = {}

    def named() -> None:
        assert name_this_thread(ENGINE_THREAD)
        seen["self"] = _comm(threading.get_native_id())
        # A thread it starts (as libgomp starts an engine's OpenMP workers) takes its name at creation.
        child = threading.Thread(target=lambda: seen.update(child=_comm(threading.get_native_id())))
        child.start()
        child.join(10)

    before = _comm(threading.get_native_id())
    _in_thread(named)
    assert seen == {"self": ENGINE_THREAD, "child": ENGINE_THREAD}
    assert _comm(threading.get_native_id()) == before  # only the calling thread is renamed


@pytest.mark.parametrize("name", ["", "x" * (MAX_NAME_BYTES + 1)])
def test_a_name_the_kernel_cannot_hold_is_refused(name: str) -> None:
    with pytest.raises(ValueError):
        name_this_thread(name)


def test_the_replicas_names_fit_the_kernels_limit_and_differ() -> None:
    names = [ENGINE_THREAD, SENDER_THREAD, METRICS_THREAD]
    assert len(set(names)) == len(names)
    assert all(0 < len(name.encode()) <= MAX_NAME_BYTES for name in names)
