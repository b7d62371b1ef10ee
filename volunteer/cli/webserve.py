"""The daemon's HTTP endpoints on the project's web stack (``volunteer.web``): Prometheus
metrics (``join --metrics``) and the donor's page (``join --web``), each on a socket bound before
the daemon started, served in the daemon's nursery."""

from __future__ import annotations

import ipaddress
import socket

import trio

from ..web.guard import Guard, GuardPolicy, loopback_hosts
from ..web.serve import listener_address, serve_app, url_of


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address a socket is bound to) is on the loopback network."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def serve_metrics(nursery: trio.Nursery, daemon, sock: socket.socket) -> str:
    """Serve the daemon's metrics on ``sock``; its URL. On loopback, only requests naming this
    server in their Host header are answered (a rebinding site cannot read them); elsewhere any
    scraper's Host is."""
    from ..web.metrics import metrics_app
    from .metrics import daemon_registry

    host, port = listener_address(sock)
    hosts = loopback_hosts(port) if is_loopback(host) else None
    app = Guard(metrics_app(daemon_registry(daemon)), GuardPolicy(allowed_hosts=hosts, read_only=True))
    await nursery.start(serve_app, app, sock)
    return url_of(sock)


async def serve_page(nursery: trio.Nursery, daemon, sock: socket.socket, token: str) -> str:
    """Serve the donor's page on ``sock`` behind ``token`` (``web_token()``); the link that logs a
    browser in (it holds the token)."""
    from .metrics import daemon_registry
    from .webpage import page_app, page_policy

    host, port = listener_address(sock)
    wide = host in ("0.0.0.0", "::")
    policy = page_policy(host, port, token, lan=(lambda: lan_names(host)) if wide else None)
    app = page_app(daemon.snapshot, lambda: daemon.history, daemon.ask, policy, registry=daemon_registry(daemon))
    await nursery.start(serve_app, app, sock)
    login = f"{url_of(sock)}/?token={token}"
    daemon.web_url, daemon.web_login = f"{url_of(sock)}/", login
    return login


def lan_names(host: str) -> tuple[str, ...]:
    """The Host values a page bound to ``host`` answers besides its own: for a wildcard bind
    (0.0.0.0, ::), this machine's interface addresses as they are now (listed again every few
    seconds: a laptop joins networks), so a headless box's page opens from the LAN at its address
    (a name such as ``box.local`` is still refused: DNS rebinding)."""
    if host not in ("0.0.0.0", "::"):
        return ()
    from ..net.interfaces import own_ips

    return tuple(f"[{ip}]" if ":" in ip else ip for ip in own_ips())


def web_token() -> str:
    """This install's web token (created on first use); VolunteerError in one line if it cannot be:
    called before joining, so a bad token file stops `join --web` at once."""
    from ..paths import config_dir
    from .webpage import load_or_create_token

    return load_or_create_token(config_dir() / "web-token")


__all__ = ["is_loopback", "lan_names", "serve_metrics", "serve_page", "web_token"]
