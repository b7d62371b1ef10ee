"""Local and public web pages on the project's one ASGI stack: Starlette apps served by
hypercorn's trio worker inside the caller's trio program.

* ``serve.py``: bind first (a busy port is one ``ListenError`` line), then serve an ASGI app on
  that socket until cancelled;
* ``guard.py``: what every page needs before it answers: a Host-header check (DNS rebinding),
  an allowed-origins check, a token, bounded request sizes;
* ``metrics.py``: a Prometheus registry as an ASGI app (``GET /metrics``);
* ``svg.py``: plots drawn server-side as inline SVG (no JavaScript library, no CDN: donors'
  machines may be offline).

It sits on the bottom floors beside ``volunteer.net`` so that both the relay and the CLI use it.
"""

from .guard import Guard, GuardPolicy, Refusal, loopback_hosts
from .serve import listener_address, open_web_socket, parse_host_port, serve_app

__all__ = ["Guard", "GuardPolicy", "Refusal", "listener_address", "loopback_hosts", "open_web_socket",
           "parse_host_port", "serve_app"]
