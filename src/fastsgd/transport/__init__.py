"""Transports: the only code that moves bytes (real processes or the simulator)."""

from fastsgd.transport.base import Done, Handle, Transport, nbytes, ring_allreduce_bytes

__all__ = ["Done", "Handle", "Transport", "nbytes", "ring_allreduce_bytes"]
