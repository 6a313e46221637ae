"""Free TCP ports for the servers the tests start, safe when pytest-xdist runs two workers.

``socket.bind(("127.0.0.1", 0))`` hands out a port from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 here), the same range every outgoing
connection draws its local port from: between the probe and the server's own ``bind`` another
worker's probe or a client connection may take it. Instead each test process draws from a block
of its own below that range: block ``i`` is ports ``10000 + 1000 * i`` to ``10999 + 1000 * i``
for xdist worker ``gw<i>`` (``PYTEST_XDIST_WORKER``; a run without xdist is block 0). Cluster
bus ports (``port + 10000``) land in 20000-29999, which no block uses. Each probe binds the port
(and the bus port) to check it is free now, so a port someone else holds is skipped; the
ports of a block are handed out in turn.
"""

from __future__ import annotations

import os
import random
import socket

#: First port of block 0; blocks are ``BLOCK`` ports wide, ``BLOCKS`` of them.
BASE = 10000
BLOCK = 1000
BLOCKS = 10
#: Offset of a Redis Cluster node's bus port from its client port (fixed by Redis).
BUS_OFFSET = 10000


def worker_index() -> int:
    """This process's xdist worker number (``gw3`` -> 3), 0 without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = name.removeprefix("gw")
    return int(digits) % BLOCKS if digits.isdigit() else 0


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


#: Where this process's next probe starts in its block: ports go round the block in turn,
#: so two calls in a row (a primary and its replica, before either started) never get one
#: port twice; the random start keeps a run clear of the ports a previous run left behind.
_next = [random.randrange(BLOCK)]


def free_port(with_bus: bool = False) -> int:
    """A TCP port free on 127.0.0.1 right now, from this worker's block, not handed out by
    the previous 999 calls of this process.

    Args:
        with_bus: also require ``port + 10000`` (a Redis Cluster bus port) to be free.

    Raises:
        RuntimeError: no port of the block is free.
    """
    first = BASE + BLOCK * worker_index()
    for _ in range(BLOCK):
        port = first + _next[0] % BLOCK
        _next[0] += 1
        if _bindable(port) and (not with_bus or _bindable(port + BUS_OFFSET)):
            return port
    raise RuntimeError(f"no free port in {first}-{first + BLOCK - 1}")
