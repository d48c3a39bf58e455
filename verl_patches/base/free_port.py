"""A TCP port for a rendezvous or a test's server on this host.

Bound on 127.0.0.1 only, never on all interfaces: asking for a port must not open one to the network, even for
the moment it takes. The port is free when this returns, not reserved: its user binds it next (a rank 0's
store, a server), and a collision with another process in between shows as that bind's error.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port number the kernel just handed to a socket on 127.0.0.1, which is closed again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
