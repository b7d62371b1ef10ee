"""The donor's page and the metrics endpoint on the web stack (hypercorn's trio worker,
Starlette), spoken to over loopback with raw HTTP/1.1 as a browser or scraper would."""

from __future__ import annotations

import socket
import time

import pytest
import trio
from prometheus_client import CollectorRegistry, Counter

from volunteer.donor.history import History
from volunteer.cli.webpage import page_app, page_policy
from volunteer.errors import ListenError
from volunteer.web.guard import Guard, GuardPolicy
from volunteer.web.metrics import metrics_app
from volunteer.web.serve import listener_address, open_web_socket, serve_app

TOKEN = "t0ken-for-the-test-only"


async def http(port: int, method: str, path: str, *, host: str | None = None, headers: dict | None = None,
               body: bytes = b"", chunked: bool = False) -> tuple[int, dict, bytes]:
    """One request on a fresh connection: (status, headers, body)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        payload = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 4096]), body[i:i + 4096]) for i in range(0, len(body), 4096))
        payload += b"0\r\n\r\n"
    else:
        lines.append(f"Content-Length: {len(body)}")
        payload = body
    try:
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
    except trio.BrokenResourceError:
        pass  # the server answered and closed before reading it all
    data = b""
    with trio.fail_after(10):
        try:
            while chunk := await stream.receive_some(65536):
                data += chunk
        except trio.BrokenResourceError:
            pass
    await stream.aclose()
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    found = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        found.setdefault(name.strip().lower(), []).append(value.strip())
    return int(status_line.split()[1]), found, rest


def snapshot() -> dict:
    return {"swarm": "demo", "peer_id": "12D3KooWtest", "conduct": {"state": "folding", "text": "folding", "events": []},
            "experts": [{"uid": "ffn.0.1", "requests": 12}], "connections": [{"peer_id": "12D3KooWpeer", "path": "relayed"}]}


@pytest.fixture
async def page(nursery):
    asked: list[tuple[str, str]] = []

    async def ask(action: str, origin: str) -> dict:
        asked.append((action, origin))
        return {"ok": True, "state": "paused"}

    history = History()
    history.add(time.time(), {"calls": 7, "cpu_s": 3.0})
    registry = CollectorRegistry()
    Counter("donor_test_calls", "calls", registry=registry).inc(3)
    sock = open_web_socket("127.0.0.1", 0, flag="--web")
    port = listener_address(sock)[1]
    app = page_app(snapshot, lambda: history, ask, page_policy("127.0.0.1", port, TOKEN), registry=registry)
    await nursery.start(serve_app, app, sock)
    return port, asked


async def test_the_page_asks_for_its_token_then_keeps_it_in_a_strict_cookie(page):
    port, _ = page
    status, _, body = await http(port, "GET", "/")
    assert status == 401 and b"token" in body
    status, headers, _ = await http(port, "GET", f"/?token={TOKEN}")
    assert status == 303 and headers["location"] == ["/"]
    cookie = headers["set-cookie"][0]
    assert cookie.startswith(f"volunteer_token={TOKEN}") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    status, headers, body = await http(port, "GET", "/", headers={"Cookie": f"volunteer_token={TOKEN}"})
    assert status == 200 and b"<svg" in body and b"ffn.0.1" in body and b"Calls per hour" in body
    assert "frame-ancestors 'none'" in headers["content-security-policy"][0]
    status, _, body = await http(port, "GET", "/api/history", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and b'"calls":7' in body.replace(b" ", b"")
    status, _, body = await http(port, "GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and b"donor_test_calls_total 3.0" in body
    assert (await http(port, "GET", "/metrics"))[0] == 401


async def test_buttons_work_from_the_page_and_nowhere_else(page):
    port, asked = page
    cookie = {"Cookie": f"volunteer_token={TOKEN}"}
    ours = {**cookie, "Origin": f"http://127.0.0.1:{port}"}
    status, headers, _ = await http(port, "POST", "/api/pause", headers=ours)
    assert status == 303 and asked == [("pause", "web")]
    status, _, body = await http(port, "POST", "/api/fold", headers={**ours, "Accept": "application/json"})
    assert status == 200 and b'"ok":true' in body.replace(b" ", b"")
    assert (await http(port, "POST", "/api/finish", headers={**cookie, "Origin": "http://evil.example"}))[0] == 403
    assert (await http(port, "POST", "/api/finish", headers=cookie))[0] == 403  # no Origin, no bearer
    assert (await http(port, "POST", "/api/finish", host="evil.example", headers=ours))[0] == 403  # DNS rebinding
    assert (await http(port, "POST", "/api/finish", headers={"Origin": f"http://127.0.0.1:{port}"}))[0] == 401
    assert (await http(port, "POST", "/api/dance", headers=ours))[0] == 404
    assert asked == [("pause", "web"), ("fold", "web")]


async def test_request_sizes_are_bounded(page):
    port, asked = page
    ours = {"Cookie": f"volunteer_token={TOKEN}", "Origin": f"http://127.0.0.1:{port}"}
    assert (await http(port, "POST", "/api/pause", headers=ours, body=b"x" * 100_000))[0] == 413
    assert (await http(port, "POST", "/api/pause", headers=ours, body=b"x" * 100_000, chunked=True))[0] == 413
    assert (await http(port, "GET", "/?" + "a" * 5000, headers=ours))[0] == 414
    status, _, _ = await http(port, "GET", "/", headers={**ours, "X-Filler": "y" * 40_000})
    assert status == 431
    assert asked == []


async def test_metrics_app_paths_and_methods(nursery):
    registry = CollectorRegistry()
    Counter("scrapes_test", "t", registry=registry).inc()
    sock = open_web_socket("127.0.0.1", 0, flag="--metrics")
    port = listener_address(sock)[1]
    await nursery.start(serve_app, Guard(metrics_app(registry), GuardPolicy(allowed_hosts=None, read_only=True)), sock)
    status, headers, body = await http(port, "GET", "/metrics?x=1")
    assert status == 200 and b"scrapes_test_total 1.0" in body and headers["content-type"][0].startswith("text/plain")
    assert (await http(port, "GET", "/"))[0] == 404
    assert (await http(port, "POST", "/metrics"))[0] == 405
    status, _, body = await http(port, "HEAD", "/metrics")
    assert status == 200 and body == b""


def test_a_busy_port_is_one_line():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(ListenError, match=f"cannot serve the web page on 127.0.0.1:{port}: the port is in use; "
                                              "choose another --web HOST:PORT"):
            open_web_socket("127.0.0.1", port, flag="--web")
    finally:
        holder.close()
