"""Relay figures as Prometheus text, served over a minimal HTTP/1.0 responder on trio."""

from __future__ import annotations

import logging

import trio

from .service import HopService

log = logging.getLogger(__name__)
MAX_REQUEST = 8192


def snapshot(service: HopService) -> dict:
    """The figures the dashboard and /metrics show."""
    resources = service.resources
    return {
        "reservations": len(resources.reservations),
        "circuits": resources.open_circuits,
        "circuits_total": resources.circuits_total,
        "bytes_relayed": resources.bytes_relayed,
        "connections": len(service.host.connections()),
        "refusals": dict(resources.refusals),
        "resource_refusals": _resource_refusals(service),
    }


def _resource_refusals(service: HopService) -> dict[str, dict[str, int]]:
    """The Host's resource manager refusals, ``{scope: {reason: count}}`` (empty without one)."""
    from volunteer.net.resources import ResourceManager

    manager = service.host.service(ResourceManager)
    return manager.refusals() if manager is not None else {}


def prometheus_text(service: HopService) -> str:
    figures = snapshot(service)
    lines = [
        "# HELP volunteer_relay_reservations Reservations held now.",
        "# TYPE volunteer_relay_reservations gauge",
        f"volunteer_relay_reservations {figures['reservations']}",
        "# HELP volunteer_relay_circuits Circuits open now.",
        "# TYPE volunteer_relay_circuits gauge",
        f"volunteer_relay_circuits {figures['circuits']}",
        "# HELP volunteer_relay_circuits_total Circuits opened since start.",
        "# TYPE volunteer_relay_circuits_total counter",
        f"volunteer_relay_circuits_total {figures['circuits_total']}",
        "# HELP volunteer_relay_bytes_total Bytes relayed, both directions.",
        "# TYPE volunteer_relay_bytes_total counter",
        f"volunteer_relay_bytes_total {figures['bytes_relayed']}",
        "# HELP volunteer_relay_connections Connections open now.",
        "# TYPE volunteer_relay_connections gauge",
        f"volunteer_relay_connections {figures['connections']}",
        "# HELP volunteer_relay_refusals_total Requests refused, by reason.",
        "# TYPE volunteer_relay_refusals_total counter",
    ]
    for reason, count in sorted(figures["refusals"].items()):
        lines.append(f'volunteer_relay_refusals_total{{reason="{reason}"}} {count}')
    lines += [
        "# HELP volunteer_refusals_total Resource-manager refusals, by scope and reason.",
        "# TYPE volunteer_refusals_total counter",
    ]
    for scope, reasons in sorted(figures["resource_refusals"].items()):
        for reason, count in sorted(reasons.items()):
            lines.append(f'volunteer_refusals_total{{scope="{scope}",reason="{reason}"}} {count}')
    return "\n".join(lines) + "\n"


async def serve_metrics(service: HopService, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Answer every HTTP GET with the Prometheus text (any path)."""

    async def respond(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(5):
                request = b""
                while b"\r\n\r\n" not in request and b"\n\n" not in request and len(request) < MAX_REQUEST:
                    chunk = await stream.receive_some(1024)
                    if not chunk:
                        break
                    request += chunk
                body = prometheus_text(service).encode()
                status = b"200 OK" if request.startswith(b"GET ") else b"405 Method Not Allowed"
                await stream.send_all(
                    b"HTTP/1.0 " + status + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
                )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[:2])
    await trio.serve_listeners(respond, listeners)
