"""Ports for tests that start a launcher which binds its port itself (torchrun's
--master-port, a MASTER_PORT in the environment)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from fastsgd.errors import UserError


def free_port() -> int:
    """A port nobody listens on now, for a launcher that binds it itself later (torchrun's
    --master-port): taken below the kernel's ephemeral range, so that no socket bound to
    port 0 in between (another job's store or message port) is given it."""
    low = _ephemeral_low()
    for _ in range(64):
        port = random.SystemRandom().randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise UserError(f"no free port on 127.0.0.1 below {low} after 64 tries")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
