"""A relay process that SIGKILLs itself mid-batch, for ``test_outbox_relay_kill.py``.

Usage::

    python tests/reliability/relay_child.py URL NAMESPACE POINT LEASE [spread]

It pairs the Redis state store on ``NAMESPACE`` with a streams transport on
``NAMESPACE-transport`` (``tests/foreign.py``), or with ``spread`` builds the spread layout's
broker (``SpreadRedisBroker``: the hand-off publishes each batch once), and relays every
outbox, with a lease of
``LEASE`` seconds, killing itself (SIGKILL: no cleanup runs) at ``POINT``:
``after_take`` (the batch is taken, nothing published) or ``after_publish`` (the batch is
on the transport, not released).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blitzq.broker.redis.spread import SpreadRedisBroker
from tests.foreign import ForeignPairing


def die(*_: Any) -> None:
    """SIGKILL this process (no finally block, no atexit)."""
    os.kill(os.getpid(), signal.SIGKILL)


async def main(url: str, namespace: str, point: str, lease: float, layout: str) -> None:
    """Relay until killed at ``point``."""
    pairing = (
        SpreadRedisBroker(url, namespace) if layout == "spread" else ForeignPairing(url, namespace)
    )
    relay = pairing.relay
    assert relay is not None
    relay.lease = lease
    if point == "after_take":

        async def publish(*_: Any) -> None:
            die()

        pairing.transport.publish = publish  # type: ignore[method-assign]
        relay.publish_once = publish  # type: ignore[attr-defined]  # HandoffRelay's (spread)
    else:
        real_release = relay.outbox.release

        async def release(*_: Any) -> None:
            die()
            await real_release("never")

        relay.outbox.release = release  # type: ignore[method-assign]
    await relay.drain()
    print("relayed without dying: nothing was in the outbox", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    layout = sys.argv[5] if len(sys.argv) > 5 else "foreign"
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), layout))
