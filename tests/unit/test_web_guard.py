"""Who may use a local page: Host header, origins, token, sizes (``GuardPolicy.check``), and
plots drawn as inline SVG."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from volunteer.web.guard import GuardPolicy, loopback_hosts, origins_of
from volunteer.web.svg import Series, bar_chart, nice_ceiling

HOSTS = loopback_hosts(7396)
PAGE = GuardPolicy(allowed_hosts=HOSTS, allowed_origins=origins_of(HOSTS), token="s3cret-token-123456",
                   open_paths=frozenset({"/app.js"}))
OK_HOST = {"host": "127.0.0.1:7396"}


def status(method="GET", path="/", query="", **headers):
    refusal = PAGE.check(method, path, query, {k.replace("_", "-"): v for k, v in headers.items()})
    return refusal.status if refusal else 200


def test_host_header_must_name_this_server():
    assert status(host="127.0.0.1:7396", cookie="volunteer_token=s3cret-token-123456") == 200
    assert status(host="localhost:7396", authorization="Bearer s3cret-token-123456") == 200
    assert status(host="evil.example:7396", cookie="volunteer_token=s3cret-token-123456") == 403  # DNS rebinding
    assert status(host="127.0.0.1:7397", cookie="volunteer_token=s3cret-token-123456") == 403
    assert status(cookie="volunteer_token=s3cret-token-123456") == 403  # no Host at all


def test_token_from_cookie_bearer_or_login_link():
    assert status(**OK_HOST) == 401
    assert status(**OK_HOST, cookie="volunteer_token=wrong") == 401
    assert status(query="token=s3cret-token-123456", **OK_HOST) == 200
    assert status(path="/app.js", **OK_HOST) == 200  # open paths need no token
    assert status(**OK_HOST, cookie="other=1; volunteer_token=s3cret-token-123456") == 200
    assert status(**OK_HOST, cookie='bad"cookie') == 401


def test_origins_and_changes():
    cookie = "volunteer_token=s3cret-token-123456"
    assert status(**OK_HOST, cookie=cookie, origin="http://evil.example") == 403
    assert status("POST", "/api/pause", **OK_HOST, cookie=cookie, origin="http://127.0.0.1:7396") == 200
    assert status("POST", "/api/pause", **OK_HOST, cookie=cookie) == 403  # a change needs our Origin...
    assert status("POST", "/api/pause", **OK_HOST, authorization="Bearer s3cret-token-123456") == 200  # ...or a bearer
    assert status("POST", "/api/pause", **OK_HOST, origin="http://127.0.0.1:7396") == 401  # and the token anyway
    assert status("POST", "/api/pause", **OK_HOST, origin="null", cookie=cookie) == 403


def test_sizes_and_read_only():
    assert status(path="/" + "a" * 3000, **OK_HOST) == 414
    assert status(**OK_HOST, cookie="volunteer_token=s3cret-token-123456", x_filler="y" * 9000) == 431
    assert status("POST", "/api/fold", **OK_HOST, content_length="999999") == 413
    assert status("POST", "/api/fold", **OK_HOST, content_length="-1") == 413
    scrape = GuardPolicy(allowed_hosts=None, read_only=True)
    assert scrape.check("GET", "/metrics", "", {"host": "anything:1"}) is None
    assert scrape.check("POST", "/metrics", "", {}).status == 405


@given(st.sampled_from(["GET", "POST", "HEAD", "PUT", ""]), st.text(max_size=60), st.text(max_size=60),
       st.dictionaries(st.sampled_from(["host", "origin", "cookie", "authorization", "content-length"]), st.text(max_size=80)))
def test_check_never_raises(method, path, query, headers):
    refusal = PAGE.check(method, path, query, headers)
    assert refusal is None or refusal.status in (401, 403, 405, 413, 414, 431)
    if refusal is None and path not in PAGE.open_paths:
        assert headers.get("host", "").lower() in HOSTS


def test_bar_chart_draws_stacked_bars_with_tooltips_and_escapes():
    svg = bar_chart(["a", "<b>"], [Series("GPU", [1, 2]), Series("CPU", [float("nan"), 3], "#f00")],
                    title="Compute & more", unit=" s")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert len(re.findall(r"<rect ", svg)) == 3  # NaN draws nothing
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "Compute &amp; more" in svg
    assert "&lt;b&gt;: GPU 2 s, CPU 3 s" in svg
    assert "nothing yet" in bar_chart(["x"], [Series("calls", [0])], title="t")


def test_nice_ceiling():
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 3, 7, 11, 240, float("inf"))] == [1, 1, 1, 5, 10, 20, 250, 1]


def test_a_page_bound_to_every_interface_opens_from_the_lan_at_this_machines_addresses(monkeypatch):
    """`join --web 0.0.0.0:PORT` said only the token keeps others out, yet the LAN address got
    '403 unknown Host header': a headless box could not be watched from the LAN."""
    from volunteer.cli import webserve
    from volunteer.cli.webpage import page_policy
    from volunteer.net import interfaces

    monkeypatch.setattr(interfaces, "own_ips", lambda: ("127.0.0.1", "192.0.2.7", "fd00::7"))
    token = "s3cret-token-123456"
    wide = page_policy("0.0.0.0", 7396, token, webserve.lan_names("0.0.0.0"))
    for host in ("192.0.2.7:7396", "[fd00::7]:7396", "127.0.0.1:7396"):
        assert wide.check("GET", "/", "", {"host": host, "cookie": f"volunteer_token={token}"}) is None, host
    refused = wide.check("GET", "/", "", {"host": "box.local:7396", "cookie": f"volunteer_token={token}"})
    assert refused is not None and refused.status == 403  # names still refused: DNS rebinding
    assert webserve.lan_names("127.0.0.1") == ()  # a loopback page stays a loopback page


def test_a_wide_page_follows_the_machines_addresses_and_says_what_it_answers_at(monkeypatch):
    """Bound to 0.0.0.0, the page answers at the addresses this machine has at each request (a
    laptop that joins a network after `join` started is reachable at its new address), takes a
    form post from the page opened there, and a refused Host hears exactly what is allowed."""
    from volunteer.cli import webserve
    from volunteer.cli.webpage import page_policy
    from volunteer.net import interfaces

    addresses = ["127.0.0.1", "192.0.2.7"]
    monkeypatch.setattr(interfaces, "own_ips", lambda: tuple(addresses))
    token = "s3cret-token-123456"
    wide = page_policy("0.0.0.0", 7396, token, lan=lambda: webserve.lan_names("0.0.0.0"))
    cookie = f"volunteer_token={token}"
    assert wide.check("GET", "/", "", {"host": "192.0.2.7:7396", "cookie": cookie}) is None
    assert wide.check("POST", "/api/pause", "", {"host": "192.0.2.7:7396", "cookie": cookie,
                                                 "origin": "http://192.0.2.7:7396"}) is None
    refused = wide.check("GET", "/", "", {"host": "198.51.100.9:7396", "cookie": cookie})
    assert refused is not None and refused.status == 403
    addresses.append("198.51.100.9")  # the machine joined another network
    assert wide.check("GET", "/", "", {"host": "198.51.100.9:7396", "cookie": cookie}) is None
    named = wide.check("GET", "/", "", {"host": "box.local:7396", "cookie": cookie})
    assert named is not None and named.status == 403  # names stay refused: DNS rebinding
    assert "'box.local:7396'" in named.reason and "192.0.2.7:7396" in named.reason
    assert "198.51.100.9:7396" in named.reason and "localhost:7396" in named.reason and "DNS rebinding" in named.reason
    # a page bound to one LAN address answers at it, and a loopback page only on loopback
    one = page_policy("192.0.2.7", 7396, token)
    assert one.check("GET", "/", "", {"host": "192.0.2.7:7396", "cookie": cookie}) is None
    assert PAGE.check("GET", "/", "", {"host": "192.0.2.7:7396", "cookie": cookie}).status == 403
