"""Ports for launchers that bind their own (fastsgd.testing.ports)."""

import socket
from pathlib import Path

from fastsgd.testing.ports import free_port


def test_a_port_for_torchrun_is_below_the_ephemeral_range_and_free():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
