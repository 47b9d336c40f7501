"""A TCP proxy in front of a real service (the machine's PostgreSQL or Redis) that a test can cut and restore,
to see what the platform does when the service goes away, without stopping the service other tests use.

`OutageProxy(5432)` listens on a free 127.0.0.1 port and forwards every connection to 127.0.0.1:5432.
`cut()` resets every open connection (both sides see it at once, as when the server's host goes away) and
resets each new one as soon as it is accepted (as a server that is down but whose port still answers: a
restart, a failover); `restore()` forwards again. `close()` stops it."""

from __future__ import annotations

import socket
import struct
import threading


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), waking a thread blocked on it (shutdown first)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class OutageProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self.forwarded = 0  # connections forwarded
        self.refused = 0  # connections reset because the proxy was cut
        threading.Thread(target=self._accept_loop, name=f"outage-proxy-{self.port}", daemon=True).start()

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        """Reset every open connection and every new one until `restore()`."""
        with self._lock:
            self._cut = True
            conns, self._open = list(self._open), set()
        for sock in conns:
            _reset(sock)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        try:
            self._listener.close()
        except OSError:
            pass

    def __enter__(self) -> OutageProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the threads ----------------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._cut:  # cut while connecting
                    self.refused += 1
                    _reset(client)
                    _reset(upstream)
                    continue
                self._open |= {client, upstream}
                self.forwarded += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            mine = src in self._open or dst in self._open
            self._open.discard(src)
            self._open.discard(dst)
        if mine:  # an orderly end of one side ends the other (a reset one was closed by cut())
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
