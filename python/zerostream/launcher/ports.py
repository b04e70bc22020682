"""A free TCP port for a job's store, picked outside the kernel's ephemeral range.

A port found by binding to port 0 comes from the ephemeral range (ip_local_port_range), the
range the kernel also hands out to outgoing connections: between the pick and the store's
bind, any connect() on the machine (a Gloo rank's, another job's) may take it, and the store
fails with "address already in use". Ports below that range are never assigned by the
kernel, so one that is free when probed stays free until a process binds it on purpose.
"""

from __future__ import annotations

import random
import socket

_FIRST = 20000  # above the well-known and most registered services' ports


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port on `host` that is free now and that the kernel does not give to connections."""
    low = _ephemeral_low()
    candidates = range(_FIRST, low) if low - _FIRST > 100 else range(1024, low)
    for port in random.sample(candidates, min(tries, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every probe was taken: the kernel's pick, as before
        s.bind((host, 0))
        return s.getsockname()[1]
