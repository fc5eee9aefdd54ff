"""Each home's embedded servers keep ports of their own (queue_db.server_ports)."""

from __future__ import annotations

import socket
import threading

import pytest

from queue_db.server_ports import PortInUseError, port_for_start, port_is_free, recorded_port

HOST = "127.0.0.1"


@pytest.fixture
def listener():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_first_start_chooses_a_free_port_and_later_starts_reuse_it(tmp_path):
    record = tmp_path / "home" / "port"
    first = port_for_start(record, None, HOST, "Bolt server", "DOCQUEUE_BOLT_PORT")
    assert recorded_port(record) == first and port_is_free(HOST, first)
    assert port_for_start(record, None, HOST, "Bolt server", "DOCQUEUE_BOLT_PORT") == first


def test_two_homes_get_different_ports_while_the_first_listens(tmp_path):
    first = port_for_start(tmp_path / "a" / "port", None, HOST, "PostgreSQL", "DOCQUEUE_PG_PORT")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind((HOST, first))
        server.listen()
        second = port_for_start(tmp_path / "b" / "port", None, HOST, "PostgreSQL", "DOCQUEUE_PG_PORT")
    assert second != first


def test_a_recorded_port_taken_meanwhile_is_replaced(tmp_path, listener):
    record = tmp_path / "port"
    record.write_text(f"{listener}\n")
    chosen = port_for_start(record, None, HOST, "Bolt server", "DOCQUEUE_BOLT_PORT")
    assert chosen != listener and recorded_port(record) == chosen


def test_an_explicit_port_wins_over_the_recorded_one(tmp_path):
    record = tmp_path / "port"
    record.write_text("1\n")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        explicit = probe.getsockname()[1]
    assert port_for_start(record, explicit, HOST, "Bolt server", "DOCQUEUE_BOLT_PORT") == explicit
    assert recorded_port(record) == explicit


def test_an_explicit_port_held_by_another_process_is_one_sentence(tmp_path, listener):
    with pytest.raises(PortInUseError) as refused:
        port_for_start(tmp_path / "port", listener, HOST, "PostgreSQL", "DOCQUEUE_PG_PORT")
    message = str(refused.value)
    assert f"{HOST}:{listener}" in message and "DOCQUEUE_PG_PORT" in message and "\n" not in message
    assert not (tmp_path / "port").exists()


def test_an_explicit_port_released_within_the_grace_is_taken(tmp_path):
    """A server stopped a moment ago (its listener still closing) does not make a restart on its port fail."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind((HOST, 0))
    holder.listen()
    port = holder.getsockname()[1]
    threading.Timer(0.5, holder.close).start()
    assert port_for_start(tmp_path / "port", port, HOST, "Bolt server", "DOCQUEUE_BOLT_PORT") == port
