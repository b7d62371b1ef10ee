"""The public swarm health page a relay serves (``volunteer relay --web HOST:PORT``): HTML,
the same model as JSON (``/api/health``) and as Prometheus metrics (``/metrics``).

Rendering is pure (model in, HTML out, from the autoescaped Jinja2 templates in ``templates/``);
the app only reads the latest cached model (kept fresh by ``healthservice.HealthService``), so a
page view costs no DHT lookup whatever the traffic.
The page is read-only and public: the guard refuses every method but GET/HEAD and bounds what a
request may carry; it has no script at all (it reloads itself every ``REFRESH_S`` seconds).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from volunteer.sizes import format_size
from volunteer.web.guard import GuardPolicy
from volunteer.web.html import BASE_STYLE, PAGE_HEADERS
from volunteer.web.svg import MAX_CELLS, Cell, cell_map
from volunteer.web.templating import Markup, render

from .health import COVERED, MISSING, UNDER

REFRESH_S = 15
MAX_UID_SERIES = 4096  # per-expert Prometheus series per scrape (the per-grid counts cover the rest)
STATUS_COLORS = {COVERED: "#2e7d32", UNDER: "#f9a825", MISSING: "#c62828"}
STYLE = BASE_STYLE + """
.cards{display:flex;gap:10px;flex-wrap:wrap}.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 16px;min-width:120px}
.card b{display:block;font-size:22px}.card span{color:#666;font-size:12px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}.legend i{display:inline-block;width:12px;height:12px;border-radius:3px;margin-right:4px;vertical-align:-1px}
h2.section{margin:18px 0 4px}
.up{color:#2e7d32;font-weight:bold}.down{color:#c62828;font-weight:bold}.map{overflow-x:auto}
.note{color:#666;font-size:12px;margin:4px 0}
"""


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _cell(cell: dict) -> Cell:
    tip = (f"{cell['uid']}: {cell['replicas']} of {cell['target']} replica(s) live ({cell['status']}); "
           f"version {cell['version']}" + (f", {cell['lagging']} replica(s) behind" if cell["lagging"] else "")
           + f"; last sync {_ago(cell['last_sync_s'])}; {cell['direct']} direct, {cell['relayed']} relayed")
    return Cell(STATUS_COLORS[cell["status"]], tip, str(cell["replicas"]), f"cell {cell['status'].split('-')[0]}")


def coverage_map(grid: dict) -> Markup:
    """A grid's experts as coloured squares: rows along the first index, columns along the rest
    (flattened beyond two dimensions); each square says its live replicas."""
    size = grid["size"]
    columns = math.prod(size[1:]) if len(size) > 1 else size[0]
    cells = [_cell(c) for c in grid["cells"]]
    rows = [cells[i:i + columns] for i in range(0, len(cells), columns)]
    labels = [f"{grid['prefix']}.{r}" for r in range(len(rows))] if len(size) > 1 else [grid["prefix"]]
    return cell_map(rows, title=f"coverage of grid {grid['prefix']}", row_labels=labels, cell=34, map_id=f"map-{grid['prefix']}")


def _percent(share: float | None) -> str:
    return "–" if share is None else f"{share * 100:.0f} %"


def _cards(swarm: dict, relay: dict) -> list[tuple[str, str]]:
    points = swarm["entry_points"]
    direct = swarm["direct"]
    return [
        (str(swarm["volunteers"]["up"]), "volunteers up"),
        (f"{swarm['volunteers']['direct']} / {swarm['volunteers']['relayed']}", "direct / relayed"),
        (_percent(direct["direct_connection_share"]), "of connections ended direct"),
        (_percent(direct["direct_data_share"]), "of bytes went direct"),
        (f"{sum(1 for p in points if p['up'])} / {len(points)}", "entry points up"),
        (str(swarm["throughput"]["calls"]), "expert calls served"),
        (format_size(int(swarm["throughput"]["bytes_sent"])), "expert replies sent"),
        (format_size(int(relay.get("bytes_relayed", 0) or 0)), "relayed by this relay"),
    ]


def render_swarm(swarm: dict, relay: dict) -> Markup:
    """One swarm's part of the page."""
    return render("health_swarm.html", "relay", swarm=swarm, cards=_cards(swarm, relay),
                  state_color=STATUS_COLORS[COVERED] if swarm["healthy"] else STATUS_COLORS[MISSING],
                  status_colors=list(STATUS_COLORS.items()), grids=[{**g, "map": coverage_map(g)} for g in swarm["grids"]],
                  max_cells=MAX_CELLS, ago=_ago, percent=_percent)


def render_page(model: dict | None) -> Markup:
    """The whole page (``model`` None: the first refresh has not finished)."""
    parts = [] if model is None else [render_swarm(s, model["relay"]) for s in model["swarms"]]
    relay_id = "" if model is None else str(model["relay"].get("peer", ""))
    return render("health_page.html", "relay", refresh_s=REFRESH_S, style=Markup(STYLE), relay_id=relay_id, swarm_parts=parts)


class HealthCollector(Collector):
    """The cached model as Prometheus gauges (read when scraped: the model is the one source)."""

    def __init__(self, model: Callable[[], dict | None]) -> None:
        self.model = model

    def collect(self):
        model = self.model()
        swarms = model["swarms"] if model else []
        experts = GaugeMetricFamily("volunteer_swarm_experts", "Experts of a grid by coverage status.",
                                    labels=["swarm", "grid", "status"])
        replicas = GaugeMetricFamily("volunteer_swarm_expert_replicas", "Live replicas of each expert.",
                                     labels=["swarm", "uid"])
        volunteers = GaugeMetricFamily("volunteer_swarm_volunteers", "Volunteers up, by path.", labels=["swarm", "path"])
        points = GaugeMetricFamily("volunteer_swarm_entry_point_up", "Whether a relay or bootstrap peer answered.",
                                   labels=["swarm", "role", "addr"])
        calls = GaugeMetricFamily("volunteer_swarm_calls_served", "Expert calls the swarm's volunteers served since they started.",
                                  labels=["swarm"])
        direct = GaugeMetricFamily("volunteer_swarm_direct_share", "Share of the volunteers' peer connections that ended "
                                    "direct and of their bytes that went direct, as they report it.", labels=["swarm", "of"])
        series = 0
        for swarm in swarms:
            name = swarm["swarm"]
            for grid in swarm["grids"]:
                for status, key in ((COVERED, "covered"), (UNDER, "under_replicated"), (MISSING, "missing")):
                    experts.add_metric([name, grid["prefix"], status], grid[key])
                for cell in grid["cells"][:max(0, MAX_UID_SERIES - series)]:
                    replicas.add_metric([name, cell["uid"]], cell["replicas"])
                    series += 1
            for path in ("direct", "relayed"):
                volunteers.add_metric([name, path], swarm["volunteers"][path])
            for point in swarm["entry_points"]:
                points.add_metric([name, point["role"], point["addr"]], 1 if point["up"] else 0)
            calls.add_metric([name], swarm["throughput"]["calls"])
            for of, key in (("connections", "direct_connection_share"), ("bytes", "direct_data_share")):
                if swarm["direct"][key] is not None:
                    direct.add_metric([name, of], swarm["direct"][key])
        yield from (experts, replicas, volunteers, points, calls, direct)


def health_policy() -> GuardPolicy:
    """A public, read-only page: any Host (it is meant to be reached by name), no token, and
    nothing but GET/HEAD; requests stay bounded in size."""
    return GuardPolicy(allowed_hosts=None, read_only=True)


def health_app(model: Callable[[], dict | None], registry: CollectorRegistry | None = None):
    """The page, its JSON (``/api/health``) and its Prometheus export (``/metrics``, with the
    relay's own figures when ``registry`` is the relay's) as one ASGI app behind the guard."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    from volunteer.web.guard import Guard

    registry = registry or CollectorRegistry()
    registry.register(HealthCollector(model))
    headers = {**PAGE_HEADERS, "cache-control": f"public, max-age={REFRESH_S // 3}"}
    rendered: dict[str, tuple[object, bytes]] = {}  # what -> (the model it was rendered from, bytes)

    def once(what: str, current: dict | None, render: Callable[[dict | None], str]) -> bytes:
        """Render each model once: every view until the next refresh sends the same bytes."""
        cached = rendered.get(what)
        if cached is None or cached[0] is not current:
            cached = rendered[what] = (current, render(current).encode())
        return cached[1]

    async def index(request: Request) -> Response:
        return Response(once("html", model(), render_page), media_type="text/html; charset=utf-8", headers=headers)

    async def api(request: Request) -> Response:
        current = model()
        if current is None:
            return JSONResponse({"error": "the first refresh has not finished"}, status_code=503, headers=headers)
        return Response(once("json", current, lambda m: json.dumps(m, separators=(",", ":"))),
                        media_type="application/json", headers=headers)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc: Exception) -> Response:
        return PlainTextResponse("not found: the page is at /, its JSON at /api/health, metrics at /metrics\n",
                                 status_code=404)

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)

    routes = [Route("/", index), Route("/api/health", api), Route("/metrics", metrics), Route("/favicon.ico", favicon)]
    return Guard(Starlette(routes=routes, exception_handlers={404: not_found}), health_policy())


__all__ = ["HealthCollector", "coverage_map", "health_app", "health_policy", "render_page", "render_swarm"]
