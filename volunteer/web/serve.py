"""Serve an ASGI app with hypercorn's trio worker on a socket bound beforehand.

Binding happens in ``open_web_socket`` before anything else starts, so a busy port or an
address that is not ours is a one-line ``ListenError`` naming the flag to change, instead of an
error deep inside a nursery. ``serve_app`` then runs hypercorn on that socket in the caller's
trio program until cancelled, with bounds on what a client may send (header block size, idle
keep-alive, read timeout) and hypercorn's own log lines routed to our logger.
"""

from __future__ import annotations

import errno
import logging
import socket

import trio

from ..errors import ListenError

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024  # a request head larger than this is refused by hypercorn (h11)
KEEP_ALIVE = 5.0  # seconds an idle keep-alive connection stays open
READ_TIMEOUT = 10  # seconds a client has to send what it started
GRACEFUL = 1.0  # seconds in-flight requests get when the server is cancelled
BACKLOG = 64


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6) → (host, port); ValueError when it is not one."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, e.g. 127.0.0.1:9100, got {text!r}")
    return host, int(port)


def host_port_arg(text: str) -> tuple[str, int]:
    """``parse_host_port`` as an argparse ``type=`` (``--web``, ``--metrics``): a bad one is a
    usage error (exit 2) in one line."""
    import argparse

    try:
        return parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def open_web_socket(host: str, port: int, *, flag: str, what: str = "the web page") -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: the OS picks one); a port in use or an
    address not ours is a ListenError that names ``flag``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot serve {what} on {host}:{port}: {exc.strerror}; check {flag} HOST:PORT") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(f"cannot serve {what} on {host}:{port}: the port is in use; choose another {flag} HOST:PORT") from None
        raise ListenError(f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}; check {flag} HOST:PORT") from None
    sock.setblocking(False)
    return sock


def listener_address(sock: socket.socket) -> tuple[str, int]:
    """The (host, port) a socket is bound to (the port the OS chose for port 0)."""
    host, port = sock.getsockname()[:2]
    return host, port


def url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket (IPv6 hosts bracketed)."""
    host, port = listener_address(sock)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve_app(app, sock: socket.socket, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` (ASGI) on the bound ``sock`` until cancelled; the socket is closed after."""
    from hypercorn.config import Config, Sockets
    from hypercorn.trio.run import worker_serve
    from hypercorn.utils import wrap_app

    config = Config()
    config.h11_max_incomplete_size = MAX_HEADER_BYTES
    config.keep_alive_timeout = KEEP_ALIVE
    config.read_timeout = READ_TIMEOUT
    config.graceful_timeout = GRACEFUL
    config.errorlog = logging.getLogger("volunteer.web.hypercorn")
    config.accesslog = None
    config.include_server_header = False
    try:
        await worker_serve(wrap_app(app, config.wsgi_max_body_size, "asgi"), config,
                           sockets=Sockets([], [sock], []), task_status=task_status)
    finally:
        sock.close()


__all__ = ["host_port_arg", "listener_address", "open_web_socket", "parse_host_port", "serve_app", "url_of"]
