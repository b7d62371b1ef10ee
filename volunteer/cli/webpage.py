"""The donor's local web page (``volunteer join --web 127.0.0.1:7396``): live state, the
run-when policy and why the daemon is paused, each expert's load, the connections and their
paths, plots of the contribution history, and fold / pause / finish buttons.

A Starlette app behind ``volunteer.web.Guard`` (Host check, allowed origins, the per-install
token, bounded requests), served by hypercorn's trio worker inside the daemon. The page is
rendered server-side (``render_live``, pure: snapshot and history in, HTML out) from the Jinja2
templates in ``templates/`` (autoescaped), with plots as inline SVG; a few lines of script of
our own (``/app.js``) refresh the live part every few seconds, and the buttons are plain forms
that work without it.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..errors import VolunteerError
from ..sizes import format_size
from ..web.guard import TOKEN_COOKIE, GuardPolicy, loopback_hosts, origins_of
from ..web.html import BASE_STYLE, PAGE_HEADERS
from ..web.svg import PALETTE, Series, bar_chart
from ..web.templating import Markup, render
from ..widgets import duration
from ..donor.history import History

DEFAULT_PORT = 7396  # the port the README suggests (Folding@home's client listens on 7396 too)
REFRESH_S = 3
CHART_WIDTH = 640  # two plots side by side on a laptop's screen
ACTIONS = ("fold", "pause", "finish")
STATE_COLORS = {"folding": "#2e7d32", "paused": "#ef6c00", "waiting": "#1565c0", "finishing": "#6a1b9a", "finished": "#555"}


def load_or_create_token(path: Path) -> str:
    """The per-install web token kept in ``path`` (0600), created on first use; VolunteerError in
    one line when it can be neither read nor written (a directory there, a read-only config)."""
    try:
        try:
            token = path.read_text().strip()
            if len(token) >= 16 and (os.name != "posix" or not stat.S_IMODE(path.stat().st_mode) & 0o077):
                return token
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)
        return token
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise VolunteerError(f"--web needs its token file {path}: {why} (move it aside, or make its directory writable)") from None


def page_policy(host: str, port: int, token: str, extra_hosts: tuple[str, ...] = (),
                lan: Callable[[], tuple[str, ...]] | None = None) -> GuardPolicy:
    """The guard of a page bound to ``host:port``: its own Host values and origins only, those of
    ``extra_hosts`` (addresses or names), and of the addresses ``lan()`` lists at each request
    (this machine's, for a page bound to every interface)."""
    names = {host if ":" not in host else f"[{host}]", *extra_hosts}
    hosts = loopback_hosts(port, names)
    more = (lambda: frozenset(f"{name}:{port}" for name in lan())) if lan is not None else None
    return GuardPolicy(allowed_hosts=hosts, allowed_origins=origins_of(hosts), token=token, more_hosts=more,
                       open_paths=frozenset({"/app.js", "/favicon.ico"}),
                       token_hint="open the link `volunteer join --web` printed (`volunteer status --json` shows it as web.login)")


# --- rendering (pure) -----------------------------------------------------------------------------


_COMMAND = re.compile(r"`volunteer (fold|pause|finish)`")


def on_page(text: str) -> str:
    """A state text as the page says it: its buttons, not the commands ("run `volunteer fold`"
    beside a Fold button read as if the button did not work)."""
    return _COMMAND.sub(lambda m: f"the {m.group(1).capitalize()} button", text)


def _verdict_line(snap: dict) -> str:
    """What the run-when policies say, beside the badge: they may allow running while the donor
    (or self-care) keeps the daemon paused, and then the line says so instead of "now: running"."""
    verdict = snap.get("policy", {}).get("verdict", {})
    state = snap.get("conduct", {}).get("state", "folding")
    if verdict.get("state", "running") != "running":
        return on_page(verdict.get("text", ""))
    if state == "folding":
        return "allow running"
    return f"would allow running; held back: {state}"


def _observed(seen: dict) -> list[str]:
    observed = []
    if seen.get("on_battery") is not None:
        observed.append("on battery" if seen["on_battery"] else "on mains power")
    if seen.get("other_load") is not None:
        observed.append(f"other programs {seen['other_load']:.0f} % CPU")
    if seen.get("input_idle_s") is not None:
        observed.append(f"no input for {duration(seen['input_idle_s'])}")
    if (seen.get("gpu_use") or "").startswith("unavailable"):  # the policy is on, but nothing tells
        observed.append(f"GPU use {seen['gpu_use']}")
    elif seen.get("gpu_users"):
        observed.append(f"GPU used by {', '.join(seen['gpu_users'][:3])}")
    if seen.get("transferred_today"):
        observed.append(f"{format_size(int(seen['transferred_today']))} transferred today")
    return observed


def _work(figures: dict) -> str:
    return (f"{figures.get('requests', 0)} calls, {figures.get('samples', 0)} samples, "
            f"{duration(figures.get('compute_s'))} compute, {_trainers(figures.get('trainers'))}")


def live_context(snap: dict, history: History, now: float) -> dict:
    """What ``donor_live.html`` shows, as plain values (the template escapes every one)."""
    conduct = snap.get("conduct", {})
    state = conduct.get("state", "folding")
    # the whole state text (a cut-off swarm or a silent relay included), else the conduct's
    said = snap.get("state_text") or conduct.get("text", "")
    policy = snap.get("policy", {})
    care = snap.get("self_care", {})
    visibility = care.get("visibility", {})
    contrib = snap.get("contributions", {})
    paused = bool(snap.get("paused"))
    # paused, the experts are withdrawn and refuse calls: the table says so rather than look live
    experts = [{"uid": e["uid"], "now": "withdrawn" if paused else "serving", "requests": e.get("requests", 0),
                "rate": "–" if paused else f"{e.get('requests_per_s', 0):.2f}", "batch": e.get("mean_batch") or "–",
                "p50": e.get("p50_ms") or "–", "errors": e.get("errors", 0), "version": e.get("version", 0)}
               for e in snap.get("experts", [])]
    connections = [{"peer": str(c.get("peer_id", ""))[-10:], "role": c.get("role", ""), "path": c.get("path", ""),
                    "via": str(c.get("via") or "")[-10:], "rtt": c.get("rtt_ms") or "–",
                    "bytes_in": format_size(int(c.get("bytes_in") or 0)), "bytes_out": format_size(int(c.get("bytes_out") or 0))}
                   for c in snap.get("connections", [])[:50]]
    events = [{"when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])), "action": e["action"],
               "origin": e["origin"], "reason": e.get("reason")}
              for e in list(reversed(conduct.get("events", [])))[:12]]
    logs = [{"level": str(r.get("level", "")).lower(), "message": str(r.get("message", ""))[:300]}
            for r in list(reversed(snap.get("log", [])))[:20] if not r.get("event")][:8]
    return {
        "state": state, "state_color": STATE_COLORS.get(state, "#555"), "state_text": on_page(said) if said != state else "",
        "actions": ACTIONS, "verdict": _verdict_line(snap), "policy_lines": policy.get("lines", []),
        "observed": ", ".join(_observed(policy.get("observed") or {})),
        "visible": {True: "visible to trainers", False: "NOT visible in the DHT", None: "not checked yet"}[visibility.get("visible")],
        "rejoins": visibility.get("rejoins", 0), "set_aside": sorted(care.get("set_aside", {}).items()),
        "machine": {"swarm": snap.get("swarm", ""), "peer_id": snap.get("peer_id", ""), "uptime": duration(snap.get("uptime_s")),
                    "reachable": snap.get("reachable_how") or "not yet",
                    "device": snap.get("compute", {}).get("device", "cpu"),
                    "session": _work(contrib.get("session", {})), "total": _work(contrib.get("total", {}))},
        "experts_title": "Experts (withdrawn while paused: no calls taken)" if paused and experts else "Experts",
        "experts": experts, "connections": connections, "charts": history_charts(history, now), "events": events, "logs": logs,
    }


def _hours_fmt(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 120:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def _trainers(count: object) -> str:
    return "1 trainer" if count == 1 else f"{count or 0} trainers"


def history_charts(history: History, now: float) -> list[Markup]:
    """The four history plots (SVG): calls and compute per hour (last 7 days), per day (last 90)."""
    hours = history.hourly(now, 7 * 24)
    hour_labels = [time.strftime("%a %H:00", time.localtime(start)) for start, _ in hours]
    days = history.daily(now, 90)
    day_labels = [day[5:] for day, _ in days]
    compute = lambda rows: [Series("GPU", [b.gpu_s for _, b in rows], PALETTE[0]), Series("CPU", [b.cpu_s for _, b in rows], PALETTE[1])]
    charts = [
        bar_chart(hour_labels, [Series("calls", [b.calls for _, b in hours], PALETTE[2])], title="Calls per hour, last 7 days",
                  tick_every=24, chart_id="chart-calls-hourly", width=CHART_WIDTH),
        bar_chart(hour_labels, compute(hours), title="Compute per hour, last 7 days", fmt=_hours_fmt, tick_every=24,
                  chart_id="chart-compute-hourly", width=CHART_WIDTH),
        bar_chart(day_labels, [Series("calls", [b.calls for _, b in days], PALETTE[2])], title="Calls per day, last 90 days",
                  tick_every=15, chart_id="chart-calls-daily", width=CHART_WIDTH),
        bar_chart(day_labels, compute(days), title="Compute per day, last 90 days", fmt=_hours_fmt, tick_every=15,
                  chart_id="chart-compute-daily", width=CHART_WIDTH),
    ]
    return charts


def render_live(snap: dict, history: History, now: float) -> Markup:
    """The live part of the page (what ``/live`` returns and the script swaps in)."""
    return render("donor_live.html", "volunteer.cli", **live_context(snap, history, now))


STYLE = BASE_STYLE + """
.buttons{display:inline-flex;gap:8px;margin-left:20px}.buttons form{margin:0}
.btn{font-size:14px;padding:5px 16px;border-radius:4px;border:1px solid #888;background:#fafafa;cursor:pointer}
.charts{display:block}.charts div{display:inline-block;margin:4px 12px 4px 0}
"""

SCRIPT = """
(function(){
  async function refresh(){
    try{
      const r = await fetch('/live', {credentials: 'same-origin', cache: 'no-store'});
      if (r.ok) { document.getElementById('live').innerHTML = await r.text(); }
    } catch (e) {}
  }
  setInterval(refresh, %d);
})();
""" % (REFRESH_S * 1000)


def render_page(snap: dict, history: History, now: float) -> Markup:
    """The whole page."""
    return render("donor_page.html", "volunteer.cli", style=Markup(STYLE), swarm=snap.get("swarm", ""),
                  short_id=str(snap.get("peer_id", ""))[-10:], live=render_live(snap, history, now))


# --- the app --------------------------------------------------------------------------------------


def page_app(snapshot: Callable[[], dict], history: Callable[[], History], ask: Callable[[str, str], Awaitable[dict]],
             policy: GuardPolicy, registry=None):
    """The page as an ASGI app behind its guard. ``ask(action, origin)`` runs fold/pause/finish."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
    from starlette.routing import Route

    from ..web.guard import Guard

    headers = PAGE_HEADERS

    async def index(request: Request) -> Response:
        if "token" in request.query_params:  # the link join printed: keep the token in a cookie
            response: Response = RedirectResponse("/", status_code=303, headers=headers)
            response.set_cookie(TOKEN_COOKIE, policy.token or "", httponly=True, samesite="strict", max_age=365 * 86400)
            return response
        return HTMLResponse(render_page(snapshot(), history(), time.time()), headers=headers)

    async def live(request: Request) -> Response:
        return HTMLResponse(render_live(snapshot(), history(), time.time()), headers=headers)

    async def status(request: Request) -> Response:
        return JSONResponse(snapshot(), headers=headers)

    async def history_json(request: Request) -> Response:
        now = time.time()
        h = history()
        return JSONResponse({
            "hours": [{"start": start, **b.as_dict()} for start, b in h.hourly(now, 7 * 24)],
            "days": [{"day": day, **b.as_dict()} for day, b in h.daily(now, 90)],
        }, headers=headers)

    async def action(request: Request) -> Response:
        name = request.path_params["action"]
        if name not in ACTIONS:
            return PlainTextResponse("unknown action: fold, pause or finish\n", status_code=404, headers=headers)
        await request.body()  # bounded by the guard; forms carry nothing we need
        result = await ask(name, "web")
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse(result, headers=headers)
        return RedirectResponse("/", status_code=303, headers=headers)

    async def script(request: Request) -> Response:
        return Response(SCRIPT, media_type="text/javascript", headers=headers)

    async def favicon(request: Request) -> Response:
        return Response(status_code=204)

    routes = [
        Route("/", index), Route("/live", live), Route("/api/status", status), Route("/api/history", history_json),
        Route("/api/{action}", action, methods=["POST"]), Route("/app.js", script), Route("/favicon.ico", favicon),
    ]
    if registry is not None:  # the daemon's Prometheus figures, behind the page's token
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        async def metrics(request: Request) -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

        routes.append(Route("/metrics", metrics))
    return Guard(Starlette(routes=routes), policy)


__all__ = ["DEFAULT_PORT", "load_or_create_token", "page_app", "page_policy", "render_live", "render_page"]
