"""A TCP proxy a test can cut and restore: a storage outage for one process only.

Pointing one process (a dispatcher, say) at Cassandra through it lets a test take the
database away from that process while the rest of the stack, and the test itself, keep
theirs. `cut()` closes every connection through it and refuses new ones until
`restore()`; `hold_replies()` lets requests through but drops what the database answers,
so a request can land while its sender never hears of it; `break_next_reply()` passes on
half of the next chunk of a reply (as read, at least `min_bytes`) and then closes the
connection, as a node dying mid-answer does (the size keeps a heartbeat on the driver's
control connection from taking the break meant for a query's reply);
`answer_only_first(n)` drops the replies of every connection after the first `n`, as a
node that accepts and then hangs (`hanging` is set once such a connection is made).
`terminate_tls(context)` makes it a TLS front for the node (which serves plaintext): new
connections must complete a handshake with `context` first (then none of the above apply).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._holding = False
        self._breaking = False
        self._break_min_bytes = 0
        self._closed = False
        self._answered: int | None = None  # connections answered; None: all of them
        self._accepted = 0
        self.hanging = threading.Event()
        self._tls: ssl.SSLContext | None = None
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def answer_only_first(self, connections: int) -> None:
        self._answered = connections

    def terminate_tls(self, context: ssl.SSLContext) -> None:
        self._tls = context

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self._close_all()

    def hold_replies(self) -> None:
        self._holding = True

    def break_next_reply(self, min_bytes: int = 0) -> None:
        self._break_min_bytes = min_bytes
        self._breaking = True

    def restore(self) -> None:
        with self._lock:
            self._cut = False
            self._holding = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_all()
        self._listener.close()

    def _close_all(self) -> None:
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._open.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._cut or self._closed:
                    client.close()
                    continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            if self._tls is not None:
                threading.Thread(
                    target=self._relay_tls, args=(client, upstream, self._tls), daemon=True
                ).start()
                continue
            silent = self._answered is not None and self._accepted >= self._answered
            self._accepted += 1
            for source, sink, is_reply in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(
                    target=self._pump, args=(source, sink, is_reply, silent), daemon=True
                ).start()
            if silent:
                self.hanging.set()

    def _pump(
        self, source: socket.socket, sink: socket.socket, is_reply: bool, silent: bool
    ) -> None:
        try:
            while data := source.recv(65536):
                if is_reply and self._breaking and len(data) >= self._break_min_bytes:
                    self._breaking = False
                    sink.sendall(data[: len(data) // 2])
                    return  # closes both sides, with the reply's tail never sent
                if not (is_reply and (self._holding or silent)):
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _relay_tls(
        self, client: socket.socket, upstream: socket.socket, context: ssl.SSLContext
    ) -> None:
        """Both directions in one thread: an SSL socket is never read and written at once."""
        sockets: tuple[socket.socket, ...] = (client, upstream)
        try:
            client.settimeout(10)
            secure = context.wrap_socket(client, server_side=True)  # the handshake
            secure.settimeout(None)
            sockets = (secure, upstream)
            with self._lock:
                self._open.add(secure)
                if self._cut or self._closed:
                    return
            while True:
                readable, _, _ = select.select(sockets, [], [])
                for source in readable:
                    sink = upstream if source is secure else secure
                    data = source.recv(65536)
                    if not data:
                        return
                    sink.sendall(data)
                    while source is secure and secure.pending():
                        sink.sendall(secure.recv(65536))
        except (OSError, ValueError):  # a refused handshake; select on a socket cut() closed
            pass
        finally:
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
