"""bench.servers.wait_until_quiet: an alternating side-by-side starts each run once the last target's tail
is done, judged on the whole machine's busy CPU."""

from __future__ import annotations

import threading
import time

import pytest

from bench.servers import busy_cpu_s, wait_until_quiet


class Machine:
    """Busy CPU seconds as a fake /proc/stat would count them: ``busy_cores`` per window, in turn."""

    def __init__(self, busy_cores: list[float], window_s: float) -> None:
        self.busy_cores, self.window_s = busy_cores, window_s
        self.busy_s = 100.0
        self.num_windows = 0

    def read(self) -> float:
        return self.busy_s

    def sleep(self, seconds: float) -> None:
        assert seconds == self.window_s
        self.busy_s += self.busy_cores[min(self.num_windows, len(self.busy_cores) - 1)] * seconds
        self.num_windows += 1


def test_it_waits_out_a_busy_tail_and_returns_the_time_waited() -> None:
    machine = Machine([1.0, 1.0, 0.9, 0.05], window_s=0.25)
    waited_s = wait_until_quiet(
        busy_below_cores=0.25, window_s=0.25, read_busy_s=machine.read, sleep=machine.sleep
    )
    assert waited_s == pytest.approx(1.0)  # three busy windows, then the quiet one
    assert machine.num_windows == 4


def test_a_quiet_machine_costs_one_window() -> None:
    machine = Machine([0.02], window_s=0.25)
    waited_s = wait_until_quiet(
        busy_below_cores=0.25, window_s=0.25, read_busy_s=machine.read, sleep=machine.sleep
    )
    assert waited_s == pytest.approx(0.25)


def test_a_machine_that_stays_busy_gives_up_at_the_timeout() -> None:
    machine = Machine([0.6], window_s=0.25)
    waited = wait_until_quiet(
        busy_below_cores=0.25, window_s=0.25, timeout_s=2.0, read_busy_s=machine.read, sleep=machine.sleep
    )
    assert waited is None
    assert machine.num_windows == 8


def test_busy_cpu_s_counts_a_spinning_thread() -> None:
    """The real counter: a thread spinning for 0.3 s adds most of 0.3 busy seconds."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    before = busy_cpu_s()
    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.3)
    stop.set()
    thread.join()
    assert busy_cpu_s() - before >= 0.2
