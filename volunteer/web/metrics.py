"""A Prometheus registry as an ASGI app: ``GET /metrics`` (a query string is ignored), 404
elsewhere, 405 for other methods. The relay's ``--metrics`` and ``volunteer join --metrics``
serve it with ``serve.serve_app``, so both endpoints behave alike; the donor's web page mounts
the same app behind its token."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def metrics_app(registry: CollectorRegistry, path: str = "/metrics"):
    """The ASGI app answering scrapes of ``registry`` at ``path``."""
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    async def scrape(request: Request) -> Response:
        body = generate_latest(registry)
        return Response(body if request.method == "GET" else b"", media_type=CONTENT_TYPE_LATEST,
                        headers={"content-length": str(len(body))})

    async def not_found(request: Request, exc: Exception) -> Response:
        return PlainTextResponse(f"not found: metrics are at {path}\n", status_code=404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return PlainTextResponse("use GET\n", status_code=405)

    from starlette.applications import Starlette

    return Starlette(routes=[Route(path, scrape, methods=["GET", "HEAD"])],
                     exception_handlers={404: not_found, 405: not_allowed})


__all__ = ["metrics_app"]
