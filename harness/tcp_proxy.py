"""A TCP proxy on loopback that can be frozen: a network partition on demand.

    proxy = TcpProxy("127.0.0.1", server_port)
    await proxy.start()            # listens on 127.0.0.1:<random>, proxy.port
    url = proxy.url(database_url)  # the same URL, through the proxy
    proxy.freeze()                 # stop forwarding; sockets stay open
    proxy.thaw()                   # forward again, the held bytes first
    proxy.cut_after(b"COMMIT")     # the next chunk a client sends that holds
                                   # these bytes reaches the server, then that
                                   # connection is closed: its reply is lost
    proxy.cut_after(b"COMMIT", refuse=True)  # ... and every later connection
                                   # is closed as it comes: the server is gone
    proxy.freeze_after(b"UPDATE")  # the next chunk holding these bytes reaches
                                   # the server, then the proxy freezes: the
                                   # server runs it, its answer is held

Frozen, the proxy reads nothing more from either side and writes nothing,
but closes nothing: to both ends the peer looks alive and silent, like a
stalled network or a paused process (TCP keepalives are answered by the
proxy's own kernel, so they do not give the stall away). Bytes read before
the freeze are delivered after the thaw, in order. New connections are
accepted while frozen and wait like the others.

Runs on the caller's asyncio loop; ``stop()`` closes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy"]

CHUNK = 65536


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self.port = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut_marker: bytes | None = None
        self._freeze_marker: bytes | None = None
        self._refuse_after_cut = False
        self.refusing = False
        self.cuts = 0

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, database_url: str) -> str:
        """``database_url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(database_url)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{userinfo}{self.listen_host}:{self.port}"))

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def cut_after(self, marker: bytes, *, refuse: bool = False) -> None:
        """Close the connection whose client next sends ``marker``, right
        after those bytes reach the server (which runs them, its answer
        lost); with ``refuse``, close every connection made afterwards as
        it is accepted. Once: the marker is then disarmed."""
        self._cut_marker = marker
        self._refuse_after_cut = refuse

    def freeze_after(self, marker: bytes) -> None:
        """Freeze (``freeze``) right after the next chunk a client sends that
        holds ``marker`` reaches the server. Once."""
        self._freeze_marker = marker

    def accept(self) -> None:
        """Forward new connections again (after ``cut_after(refuse=True)``)."""
        self.refusing = False

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.refusing:
            client_w.close()
            return
        try:
            server_r, server_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, server_w}
        pumps = [
            asyncio.create_task(self._pump(client_r, server_w, client=client_w)),
            asyncio.create_task(self._pump(server_r, client_w)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            for writer in (client_w, server_w):
                writer.close()
                self._writers.discard(writer)
            self._tasks.difference_update(pumps)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: asyncio.StreamWriter | None = None,
    ) -> None:
        """Copy ``reader`` to ``writer``; ``client``: the client's side, when
        this is its way to the server (where ``cut_after`` looks)."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await self._flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    return
                # Frozen while reading: hold the bytes until the thaw.
                await self._flowing.wait()
                marker = self._cut_marker
                if client is not None and marker is not None and marker in data:
                    # The client first, so that not a byte of the answer reaches it.
                    client.transport.abort()
                    self._cut_marker = None
                    self.cuts += 1
                    self.refusing = self._refuse_after_cut
                    writer.write(data)
                    await writer.drain()
                    return  # _accept closes the server's side
                held = self._freeze_marker
                if client is not None and held is not None and held in data:
                    # Frozen first, so that not a byte of the answer comes back.
                    self._freeze_marker = None
                    self.freeze()
                writer.write(data)
                await writer.drain()
