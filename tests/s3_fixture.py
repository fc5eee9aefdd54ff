"""A real S3-compatible server (moto in server mode on 127.0.0.1) for the tests of S3 intake, registered by
tests/conftest.py: one server per test module that asks for it."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
