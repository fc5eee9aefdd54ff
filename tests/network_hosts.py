"""Worker "machines" on one host: network namespaces on a private bridge, each reaching the host only through a
veth pair. The cluster acceptance test and bench/scale_out.py place their Celery workers in them, so that every
byte a worker exchanges with the broker, PostgreSQL and the Bolt server crosses a network interface, as between
machines, instead of loopback."""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Machines:
    """`count` network namespaces on a private bridge: the bridge holds the host's address, each namespace one
    veth end with its own address. Names carry a random suffix; `remove()` deletes exactly what was made."""

    def __init__(self, count: int):
        suffix = uuid.uuid4().hex[:6]
        self.bridge = f"dqb{suffix}"
        self.namespaces = [f"dqc-{suffix}-{i}" for i in range(count)]
        self.veths = [f"dqv{suffix}{i}" for i in range(count)]
        self.network = self._unused_network()
        hosts = list(self.network.hosts())
        self.host_ip, self.addresses = str(hosts[0]), [str(hosts[10 + i]) for i in range(count)]

    @staticmethod
    def _unused_network() -> ipaddress.IPv4Network:
        in_use = ip("-4", "-o", "addr").stdout + ip("-4", "route").stdout
        for _ in range(50):
            network = ipaddress.ip_network(f"10.{random.randint(200, 254)}.{random.randint(0, 255)}.0/24")
            if f"{str(network.network_address).rsplit('.', 1)[0]}." not in in_use:
                return network
        raise RuntimeError("no free private /24 for the test bridge")

    def create(self) -> None:
        ip("link", "add", "name", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for namespace, veth, address in zip(self.namespaces, self.veths, self.addresses):
            ip("netns", "add", namespace)
            ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            ip("link", "set", f"{veth}p", "netns", namespace)
            ip("link", "set", veth, "master", self.bridge, "up")
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", f"{veth}p")
            ip("-n", namespace, "link", "set", f"{veth}p", "up")
            ip("-n", namespace, "link", "set", "lo", "up")

    def remove(self) -> None:
        for namespace, veth in zip(self.namespaces, self.veths):
            ip("netns", "del", namespace, check=False)  # takes its veth end, and so the pair, with it
            ip("link", "del", veth, check=False)
        ip("link", "del", self.bridge, check=False)

    def reaches(self, namespace: str, port: int) -> bool:
        probe = f"import socket; socket.create_connection(({self.host_ip!r}, {port}), timeout=3).close()"
        return (
            subprocess.run(
                ["ip", "netns", "exec", namespace, sys.executable, "-c", probe], capture_output=True, timeout=30
            ).returncode
            == 0
        )


def namespaces_unusable() -> str | None:
    """Why this host cannot make network namespaces, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("redis-server") is None:
        return "needs iproute2 (`ip`) and redis-server"
    probe = f"dqprobe{uuid.uuid4().hex[:6]}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def wait_port(host: str, port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on {host}:{port}")
