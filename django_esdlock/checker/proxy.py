"""A loopback TCP proxy between the workers and the store: the store, black-hole and latency faults act on it."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time

BUFFER = 65536


class Proxy:
    """Forward ``127.0.0.1:port`` to ``(host, port)``; :meth:`cut` drops every connection and refuses new ones.

    A cut is a fast failure: open connections are reset and new ones are
    accepted and closed at once, so clients see errors instead of waiting out
    their socket timeouts. :meth:`black_hole` is the slow one: nothing is
    forwarded any more, either way, and every socket stays open (new
    connections are accepted and left waiting), as when a peer hangs or a
    network drops packets; :meth:`resume` forwards what was held and goes on.
    :attr:`latency` delays every answer (bytes from the target) that long: a
    slow store; :meth:`slow` delays every chunk, either way, by a random time
    within a range: a slow, jittery link.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self._flowing = threading.Event()
        self._flowing.set()
        self.connections = 0
        self.refused = 0
        self.held = 0
        """Connections and chunks of bytes that arrived while black-holed (a call caught there)."""
        self.latency = 0.0
        """Seconds each chunk of bytes from the target waits before it is forwarded."""
        self._jitter: tuple[float, float] | None = None
        self._rng = random.Random()
        self._thread = threading.Thread(target=self._accept, name="lock-check-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._flowing.is_set():  # black-holed: the client is connected, nobody answers
                with self._lock:
                    self.held += 1
                self._flowing.wait()
            with self._lock:
                refuse = self._cut or self._closed
            if refuse:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
                self.connections += 1
            for a, b, answers in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(a, b, answers), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(BUFFER):
                if answers and self.latency:
                    time.sleep(self.latency)
                jitter = self._jitter
                if jitter is not None:
                    time.sleep(self._rng.uniform(*jitter))
                if not self._flowing.is_set():
                    with self._lock:
                        self.held += 1
                    self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets.discard(source)
            source.close()

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until :meth:`restore`."""
        with self._lock:
            self._cut = True
            sockets, self._sockets = self._sockets, set()
        for s in sockets:
            _reset(s)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def black_hole(self) -> None:
        """Stop forwarding, both ways, on open and new connections alike; keep every socket open."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, what was held first."""
        self._flowing.set()

    def slow(self, low: float, high: float) -> None:
        """Delay every chunk of bytes, either way, by a random time from ``low`` to ``high`` seconds."""
        self._jitter = (low, high)

    def fast(self) -> None:
        """Forward without delay again."""
        self._jitter = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.cut()
        self._flowing.set()
        self._listener.close()


def _reset(s: socket.socket) -> None:
    """Drop ``s`` so the peer fails at once: a reset on close (SO_LINGER 0); the shutdown wakes its pump."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()


class Proxies:
    """One :class:`Proxy` per store endpoint (every node of a cluster), each fault acting on all of them at once."""

    def __init__(self, targets: list[tuple[str, int]]) -> None:
        self.proxies = [Proxy(*target) for target in targets]
        self.ports = [proxy.port for proxy in self.proxies]

    def _each(self, method: str, *args: float) -> None:
        for proxy in self.proxies:
            getattr(proxy, method)(*args)

    def cut(self) -> None:
        self._each("cut")

    def restore(self) -> None:
        self._each("restore")

    def black_hole(self) -> None:
        self._each("black_hole")

    def resume(self) -> None:
        self._each("resume")

    def slow(self, low: float, high: float) -> None:
        self._each("slow", low, high)

    def fast(self) -> None:
        self._each("fast")

    def close(self) -> None:
        self._each("close")
