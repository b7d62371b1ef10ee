"""Serve a ``prometheus_client`` registry over HTTP on trio: ``GET /metrics`` and nothing else.

prometheus-client's own ``start_http_server`` runs a thread per server; the relay and the
volunteer daemon are trio programs, so this is a minimal HTTP/1.0 responder in their event loop
that answers with ``generate_latest(registry)``: 200 on ``/metrics`` (a query string is ignored),
404 on any other path, 405 on any other method, 400 on garbage. Both the relay's ``--metrics``
and ``volunteer join --metrics`` use it, so their endpoints behave alike.

Binding happens in ``open_metrics_listener`` before anything else starts, so a busy port is one
``ListenError`` line for the user instead of an error deep inside a nursery.
"""

from __future__ import annotations

import errno

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .errors import ListenError

MAX_REQUEST = 8192  # bytes of request head we read before answering 400
REQUEST_TIMEOUT = 5.0  # seconds a scraper has to send its request


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6) → (host, port); ValueError when it is not one."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, e.g. 127.0.0.1:9100, got {text!r}")
    return host, int(port)


async def open_metrics_listener(host: str, port: int, *, flag: str = "--metrics") -> trio.SocketListener:
    """Bind the metrics port now; a port in use or an address not ours is a one-line ListenError
    that names ``flag`` so the user knows what to change."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(f"cannot serve metrics on {host}:{port}: the port is in use; choose another {flag} HOST:PORT") from None
        raise ListenError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; check {flag} HOST:PORT") from None
    for extra in listeners[1:]:  # one address family is enough for a scraper
        await extra.aclose()
    return listeners[0]


def listener_address(listener: trio.SocketListener) -> tuple[str, int]:
    """The (host, port) a listener is bound to (the port the OS chose for port 0)."""
    host, port = listener.socket.getsockname()[:2]
    return host, port


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


def respond_to(request: bytes, registry: CollectorRegistry) -> bytes:
    """The whole HTTP response to one request head (pure: testable without sockets)."""
    line = request.split(b"\r\n", 1)[0].split(b"\n", 1)[0]
    parts = line.split()
    if len(parts) < 2:
        return _response("400 Bad Request", b"bad request\n")
    method, target = parts[0], parts[1]
    path = target.split(b"?", 1)[0]
    if path != b"/metrics":
        return _response("404 Not Found", b"not found: metrics are at /metrics\n")
    if method not in (b"GET", b"HEAD"):
        return _response("405 Method Not Allowed", b"use GET\n")
    body = generate_latest(registry)
    response = _response("200 OK", body, CONTENT_TYPE_LATEST)
    return response[: len(response) - len(body)] if method == b"HEAD" else response


async def serve_registry(listener: trio.SocketListener, registry: CollectorRegistry, *,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Answer scrapes on ``listener`` until cancelled."""

    async def one(stream: trio.SocketStream) -> None:
        try:
            request = b""
            with trio.move_on_after(REQUEST_TIMEOUT):
                while b"\r\n\r\n" not in request and b"\n\n" not in request and len(request) < MAX_REQUEST:
                    chunk = await stream.receive_some(1024)
                    if not chunk:
                        break
                    request += chunk
            await stream.send_all(respond_to(request, registry))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    await trio.serve_listeners(one, [listener], task_status=task_status)


__all__ = ["listener_address", "open_metrics_listener", "parse_host_port", "respond_to", "serve_registry"]
