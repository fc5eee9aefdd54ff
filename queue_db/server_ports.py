"""TCP ports of the embedded servers: each DOCQUEUE_HOME keeps its own, so two projects on one machine never
reach for the same one.

A port is chosen free on a server's first start and recorded in its home; later starts reuse it. A port set
explicitly (a constructor argument or DOCQUEUE_PG_PORT / DOCQUEUE_BOLT_PORT) always wins, and when another process
holds it the start is refused with one sentence rather than moved elsewhere, since the user asked for that port.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path


class PortInUseError(RuntimeError):
    """An explicitly configured port is held by another process; the message is one sentence for the user."""


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# a server stopped a moment ago may hold its port while the kernel closes its listener: an explicit port is
# refused only when it stays taken this long
EXPLICIT_PORT_GRACE_S = 3.0


def _free_within(host: str, port: int, grace_s: float) -> bool:
    deadline = time.monotonic() + grace_s
    while not port_is_free(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port(host: str) -> int:
    """A port nobody listens on now, chosen by the kernel."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def recorded_port(record: Path) -> int | None:
    try:
        return int(record.read_text().strip())
    except (OSError, ValueError):
        return None


def port_for_start(record: Path, explicit: int | None, host: str, server: str, variable: str) -> int:
    """The port a server about to start listens on, recorded in `record` for the next start.

    `explicit` wins and must be free. Otherwise the recorded port is reused while it is free, and a new free one
    is chosen (and recorded) on the first start or when another process has taken the recorded one meanwhile."""
    if explicit is not None:
        if not _free_within(host, explicit, EXPLICIT_PORT_GRACE_S):
            raise PortInUseError(
                f"port {host}:{explicit} ({variable}) for the embedded {server} is already in use "
                f"by another process; stop that process, choose another port or unset {variable} "
                "to let docqueue pick a free one"
            )
        port = explicit
    else:
        recorded = recorded_port(record)
        port = recorded if recorded is not None and port_is_free(host, recorded) else free_port(host)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(f"{port}\n")
    return port
