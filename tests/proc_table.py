"""Which processes are alive, read from /proc: for tests that check nothing is left behind."""

from __future__ import annotations

import os
from pathlib import Path


def processes_mentioning(text: str) -> list[int]:
    """Pids (other than this one) whose command line contains ``text``, e.g. one server's shm prefix."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids
