"""Free TCP ports on 127.0.0.1 for the servers tests start."""

from __future__ import annotations

import socket
from contextlib import ExitStack


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now (held open together, so they are distinct)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port() -> int:
    return free_ports(1)[0]
