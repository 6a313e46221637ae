"""A small TCP fault proxy for the chaos suite (asyncio, in a background thread).

One :class:`FaultProxy` listens on a free loopback port and forwards every connection to an
upstream ``host:port`` (a private ``redis-server``). Give each worker its own proxy and the
faults below hit that worker alone:

- :meth:`FaultProxy.set_latency`: delay every forwarded chunk, both directions (seconds).
- :meth:`FaultProxy.cut`: close every open connection at once (both sides see a reset/EOF);
  new connections are accepted as usual.
- :meth:`FaultProxy.half_open`: keep every open connection open but stop forwarding on it,
  for good: the client's socket stays up while nothing comes back (a peer that vanished
  without a FIN). New connections work.
- :meth:`FaultProxy.partition` / :meth:`FaultProxy.heal`: stop forwarding on every
  connection, open or new (new ones are accepted and then hang), until healed; on heal the
  data held back flows again.
- :meth:`FaultProxy.close_all`: close every open connection with a FIN (an orderly close,
  where :meth:`cut` resets).
- :meth:`FaultProxy.blackhole`: a silent partition that outlives the connections: every open
  connection is frozen for good (:meth:`half_open`) and new ones are accepted and then hang,
  until :meth:`heal` (after which new connections work; the frozen ones stay dead, as both
  ends would have timed them out).
- :meth:`FaultProxy.freeze_upstream`: as :meth:`half_open`, for the connections the upstream
  server sees from the given ports only (one client of many: a replica's replication link).
- :meth:`FaultProxy.refuse`: new connections are reset as soon as they are accepted (a
  server that refuses them), until :meth:`heal`.

Only loopback addresses are used. The proxy never parses the protocol it forwards (Redis or
AMQP: :meth:`FaultProxy.url_for` rewrites another URL to go through it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from typing import Any

CHUNK = 65536


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.frozen = False  # half-open: never forward again
        self.tasks: list[asyncio.Task[None]] = []

    def close(self, reset: bool = True) -> None:
        for writer in (self.client, self.upstream):
            with contextlib.suppress(Exception):
                sock = writer.get_extra_info("socket")
                if sock is not None and reset:  # RST rather than FIN: an abrupt cut
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            with contextlib.suppress(Exception):
                writer.close()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``, with injectable faults.

    Args:
        upstream_host: address of the real server (loopback).
        upstream_port: its port.

    Use :meth:`start` before and :meth:`stop` after; :attr:`url` is the Redis URL to hand to
    the client that should go through the proxy.
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        self.latency = 0.0
        self.partitioned = False
        self.refusing = False
        self.connections = 0
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._healed: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` of the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def url_for(self, url: str) -> str:
        """``url`` (any ``scheme://[user@]host:port/...``) with its host and port replaced by
        the proxy's."""
        scheme, _, rest = url.partition("://")
        netloc, slash, path = rest.partition("/")
        user, at, _ = netloc.rpartition("@")
        return f"{scheme}://{user}{at}127.0.0.1:{self.port}{slash}{path}"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the proxy's event loop thread and listening socket."""
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._healed = asyncio.Event()
            self._healed.set()
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fault proxy did not start")

    def stop(self) -> None:
        """Close every connection and the listener; end the thread."""
        if self._loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for link in list(self._links):
                link.close()
            self._links.clear()

        with contextlib.suppress(Exception):
            self._call(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # --------------------------------------------------------------- faults
    def set_latency(self, seconds: float) -> None:
        """Delay each forwarded chunk by ``seconds`` (0 turns it off)."""
        self.latency = max(0.0, seconds)

    def cut(self) -> int:
        """Reset every open connection; return how many were cut."""

        async def do() -> int:
            links = list(self._links)
            for link in links:
                link.close()
                self._links.discard(link)
            return len(links)

        return int(self._call(do()))

    def half_open(self) -> int:
        """Freeze every open connection for good (open, silent); return how many."""

        async def do() -> int:
            links = [link for link in self._links if not link.frozen]
            for link in links:
                link.frozen = True
            return len(links)

        return int(self._call(do()))

    def close_all(self) -> int:
        """Close every open connection with a FIN (both sides); return how many."""

        async def do() -> int:
            links = list(self._links)
            for link in links:
                link.close(reset=False)
                self._links.discard(link)
            return len(links)

        return int(self._call(do()))

    def blackhole(self) -> int:
        """Freeze every open connection for good and hold new ones silent until
        :meth:`heal`; return how many were frozen."""
        frozen = self.half_open()
        self.partition()
        return frozen

    def freeze_upstream(self, ports: set[int]) -> int:
        """Freeze for good (:meth:`half_open`) the open connections whose upstream side uses
        one of ``ports`` as its local port (how the upstream server names that client, e.g.
        in ``CLIENT LIST``); returns how many were frozen. The others go on."""

        async def do() -> int:
            frozen = 0
            for link in self._links:
                sockname = link.upstream.get_extra_info("sockname")
                if sockname is not None and sockname[1] in ports:
                    link.frozen = True
                    frozen += 1
            return frozen

        return int(self._call(do()))

    def refuse(self) -> None:
        """Reset every new connection as soon as it is accepted, until :meth:`heal`."""
        self.refusing = True

    def partition(self) -> None:
        """Stop forwarding on every connection, open or new, until :meth:`heal`."""

        async def do() -> None:
            assert self._healed is not None
            self.partitioned = True
            self._healed.clear()

        self._call(do())

    def heal(self) -> None:
        """End a partition: held-back data flows again (frozen half-open links stay frozen)."""

        async def do() -> None:
            assert self._healed is not None
            self.partitioned = False
            self.refusing = False
            self._healed.set()

        self._call(do())

    # ----------------------------------------------------------- forwarding
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            with contextlib.suppress(Exception):
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        except OSError:
            writer.close()
            return
        self.connections += 1
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.ensure_future(self._pump(link, reader, up_writer)),
            asyncio.ensure_future(self._pump(link, up_reader, writer)),
        ]

    async def _pump(
        self, link: _Link, source: asyncio.StreamReader, sink: asyncio.StreamWriter
    ) -> None:
        assert self._healed is not None
        try:
            while True:
                data = await source.read(CHUNK)
                if not data:
                    break
                if self.latency:
                    await asyncio.sleep(self.latency)
                await self._healed.wait()
                if link.frozen:
                    await asyncio.Event().wait()  # silent forever (until cut or stop)
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not link.frozen:
                link.close()
                self._links.discard(link)
