"""Who may use a local web page, decided before the app sees the request.

A page on 127.0.0.1 is reachable by every web page the donor's browser opens and, through DNS
rebinding, by any site whose name resolves to 127.0.0.1 for a moment. So, as Folding@home's and
Jupyter's local servers do, every request passes four checks (``GuardPolicy.check``, pure):

* **Host**: the ``Host`` header must name this server (``127.0.0.1:PORT``, ``localhost:PORT``,
  ``[::1]:PORT``, the address it is bound to, and, bound to every interface, this machine's
  addresses as they are now): a rebinding site's requests carry its own name; a refusal lists
  what is allowed;
* **Origin**: a request that carries an ``Origin`` must come from an allowed one, and a request
  that changes something (not GET/HEAD) must carry an allowed Origin or the token in an
  ``Authorization: Bearer`` header (which no foreign page can set without a preflight we deny);
* **token**: a per-install secret, presented once as ``?token=`` (the page then keeps it in an
  HttpOnly, SameSite=Strict cookie), or as a bearer header by scripts;
* **size**: request targets, headers, declared bodies and streamed bodies are bounded.

``Guard`` is the ASGI middleware that applies it; a refusal is a short plain-text reply.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

TOKEN_COOKIE = "volunteer_token"
MAX_BODY = 16 * 1024  # bytes of a request body (the page's forms and actions are tiny)
MAX_TARGET = 2048  # bytes of a request's path and query
MAX_HEADERS = 8 * 1024  # bytes of a request's headers (names and values)
SAFE_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: HTTP ``status`` and a one-line ``reason``."""

    status: int
    reason: str


def loopback_hosts(port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host header values of a server on loopback ``port`` (plus ``extra`` names)."""
    names = {"127.0.0.1", "localhost", "[::1]", *extra}
    return frozenset({f"{name}:{port}" for name in names} | ({*names} if port == 80 else set()))


def origins_of(hosts: Iterable[str]) -> frozenset[str]:
    """The http origins of the given Host values (what a browser sends as ``Origin``)."""
    return frozenset(f"http://{host}" for host in hosts)


@dataclass(frozen=True)
class GuardPolicy:
    """What a page allows: Host values (None: any, for a public read-only page or a scraper's
    endpoint), origins, the token (None: no token) and the paths open without it."""

    allowed_hosts: frozenset[str] | None
    allowed_origins: frozenset[str] = frozenset()
    token: str | None = None
    open_paths: frozenset[str] = frozenset()
    max_body: int = MAX_BODY
    max_target: int = MAX_TARGET
    max_headers: int = MAX_HEADERS
    read_only: bool = False  # refuse every method but GET and HEAD
    token_hint: str = "ask whoever runs this server for the link"  # where a refused visitor finds the token
    cookie: str = field(default=TOKEN_COOKIE)
    # Host values allowed besides ``allowed_hosts``, asked per request (a page bound to every
    # interface answers at this machine's addresses, which change as it joins networks)
    more_hosts: Callable[[], frozenset[str]] | None = None

    def hosts(self) -> frozenset[str] | None:
        """Every Host value allowed now (None: any)."""
        if self.allowed_hosts is None:
            return None
        return self.allowed_hosts | self.more_hosts() if self.more_hosts is not None else self.allowed_hosts

    def check(self, method: str, path: str, query: str, headers: dict[str, str]) -> Refusal | None:
        """The refusal for a request, or None to let it through. ``headers``: lower-case names."""
        if len(path) + len(query) > self.max_target:
            return Refusal(414, "request target too long")
        if sum(len(name) + len(value) for name, value in headers.items()) > self.max_headers:
            return Refusal(431, "request headers too large")
        host = headers.get("host", "").lower()
        hosts = self.hosts()
        if hosts is not None and host not in hosts:
            return Refusal(403, _unknown_host(host, hosts))
        if self.read_only and method not in SAFE_METHODS:
            return Refusal(405, "this page is read-only")
        length = headers.get("content-length", "")
        if length and (not length.isdigit() or int(length) > self.max_body):
            return Refusal(413, f"request body larger than {self.max_body} bytes")
        origin = headers.get("origin")
        allowed_origin = origin is not None and (
            origin.lower() in self.allowed_origins
            or (self.more_hosts is not None and origin.lower() in origins_of(self.more_hosts())))
        if origin is not None and not allowed_origin:
            return Refusal(403, "cross-origin request refused")
        if self.token is None or path in self.open_paths:
            return None
        bearer = _bearer(headers.get("authorization", ""))
        presented = bearer or _cookie(headers.get("cookie", ""), self.cookie) or _query_token(query)
        if not presented or not secrets.compare_digest(presented, self.token):
            return Refusal(401, f"missing or wrong token: {self.token_hint}")
        if method not in SAFE_METHODS and not allowed_origin and not bearer:
            return Refusal(403, "a change needs the page's own Origin or a bearer token")
        return None


def _unknown_host(host: str, allowed: frozenset[str]) -> str:
    """The refusal of a Host header, naming what is allowed (a page opened by a name of its own
    must say which addresses work: names are refused so no site can rebind one to this server)."""
    shown = sorted(allowed, key=lambda h: (not h[0].isdigit() and not h.startswith("["), h))
    listed = ", ".join(shown[:8]) + (f" and {len(shown) - 8} more" if len(shown) > 8 else "")
    return (f"unknown Host header {host[:80]!r}: this page answers only at {listed} "
            "(other names are refused against DNS rebinding)")


def _bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _cookie(value: str, name: str) -> str:
    if not value:
        return ""
    jar = SimpleCookie()
    try:
        jar.load(value)
    except CookieError:
        return ""
    morsel = jar.get(name)
    return morsel.value if morsel is not None else ""


def _query_token(query: str) -> str:
    values = parse_qs(query, max_num_fields=16).get("token", [])
    return values[0] if values else ""


class BodyTooLarge(Exception):
    """A streamed request body passed the guard's bound (the guard has replied 413)."""


class Guard:
    """ASGI middleware: requests that ``policy`` refuses get a plain-text refusal; bodies are
    counted as they stream in and cut at ``policy.max_body``."""

    def __init__(self, app, policy: GuardPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}; {text}" if key == "cookie" and key in headers else headers.get(key, text)
        query = scope.get("query_string", b"").decode("latin-1")
        refusal = self.policy.check(scope["method"], scope["path"], query, headers)
        if refusal is not None:
            await _refuse(send, refusal)
            return
        budget = self.policy.max_body
        refused = False  # the 413 went out: whatever the app sends after is dropped

        async def bounded_receive():
            nonlocal budget, refused
            message = await receive()
            if message["type"] == "http.request":
                budget -= len(message.get("body", b""))
                if budget < 0:
                    if not refused:
                        refused = True
                        await _refuse(send, Refusal(413, f"request body larger than {self.policy.max_body} bytes"))
                    raise BodyTooLarge()
            return message

        async def guarded_send(message):
            if not refused:
                await send(message)

        try:
            await self.app(scope, bounded_receive, guarded_send)
        except BodyTooLarge:
            pass  # answered with 413 above; frameworks re-raise what the app's receive raised


async def _refuse(send, refusal: Refusal) -> None:
    body = f"{refusal.status} {refusal.reason}\n".encode()
    await send({"type": "http.response.start", "status": refusal.status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["BodyTooLarge", "Guard", "GuardPolicy", "MAX_BODY", "Refusal", "TOKEN_COOKIE", "loopback_hosts", "origins_of"]
