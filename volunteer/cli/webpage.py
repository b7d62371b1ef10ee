"""The donor's local web page (``volunteer join --web 127.0.0.1:7396``): live state, the
run-when policy and why the daemon is paused, each expert's load, the connections and their
paths, plots of the contribution history, and fold / pause / finish buttons.

A Starlette app behind ``volunteer.web.Guard`` (Host check, allowed origins, the per-install
token, bounded requests), served by hypercorn's trio worker inside the daemon. The page is
rendered server-side (``render_live``, pure: snapshot and history in, HTML out) with plots as
inline SVG; a few lines of script of our own (``/app.js``) refresh the live part every few
seconds, and the buttons are plain forms that work without it.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from collections.abc import Awaitable, Callable
from html import escape
from pathlib import Path

from ..errors import VolunteerError
from ..sizes import format_size
from ..web.guard import TOKEN_COOKIE, GuardPolicy, loopback_hosts, origins_of
from ..web.html import BASE_STYLE, PAGE_HEADERS, table
from ..web.svg import PALETTE, Series, bar_chart
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


def page_policy(host: str, port: int, token: str, extra_hosts: tuple[str, ...] = ()) -> GuardPolicy:
    """The guard of a page bound to ``host:port``: its own Host values and origins only."""
    names = {host if ":" not in host else f"[{host}]", *extra_hosts}
    hosts = loopback_hosts(port, names)
    return GuardPolicy(allowed_hosts=hosts, allowed_origins=origins_of(hosts), token=token,
                       open_paths=frozenset({"/app.js", "/favicon.ico"}),
                       token_hint="open the link `volunteer join --web` printed (`volunteer status --json` shows it as web.login)")


# --- rendering (pure) -----------------------------------------------------------------------------


_COMMAND = re.compile(r"`volunteer (fold|pause|finish)`")


def on_page(text: str) -> str:
    """A state text as the page says it: its buttons, not the commands ("run `volunteer fold`"
    beside a Fold button read as if the button did not work)."""
    return _COMMAND.sub(lambda m: f"the {m.group(1).capitalize()} button", text)


def _state_part(snap: dict) -> str:
    conduct = snap.get("conduct", {})
    state = conduct.get("state", "folding")
    color = STATE_COLORS.get(state, "#555")
    buttons = "".join(
        f'<form method="post" action="/api/{a}"><button type="submit" id="btn-{a}" class="btn">{a.capitalize()}</button></form>'
        for a in ACTIONS
    )
    # the whole state text (a cut-off swarm or a silent relay included), else the conduct's
    said = snap.get("state_text") or conduct.get("text", "")
    return (f'<section class="state"><span id="state" class="badge" style="background:{color}">{escape(state)}</span>'
            f' <span id="state-text">{escape(on_page(said) if said != state else "")}</span>'
            f'<div class="buttons">{buttons}</div></section>')


def _verdict_line(snap: dict) -> str:
    """What the run-when policies say, beside the badge: they may allow running while the donor
    (or self-care) keeps the daemon paused, and then the line says so instead of "now: running"."""
    verdict = snap.get("policy", {}).get("verdict", {})
    state = snap.get("conduct", {}).get("state", "folding")
    if verdict.get("state", "running") != "running":
        return escape(on_page(verdict.get("text", "")))
    if state == "folding":
        return "allow running"
    return f"would allow running; held back: {escape(state)}"


def _policy_part(snap: dict) -> str:
    policy = snap.get("policy", {})
    seen = policy.get("observed") or {}
    lines = "".join(f"<li>{escape(line)}</li>" for line in policy.get("lines", []))
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
    care = snap.get("self_care", {})
    aside = "".join(f"<li>{escape(uid)}: {escape(why)}</li>" for uid, why in sorted(care.get("set_aside", {}).items()))
    visibility = care.get("visibility", {})
    visible = {True: "visible to trainers", False: "NOT visible in the DHT", None: "not checked yet"}[visibility.get("visible")]
    return (f'<section><h2>Run-when policy</h2><p id="verdict">policies: <b>{_verdict_line(snap)}</b></p>'
            f"<ul>{lines}</ul><p class=\"muted\">{escape(', '.join(observed)) or 'no observations yet'}</p>"
            f"<h3>Self-care</h3><p>experts {visible}; re-joined {visibility.get('rejoins', 0)} times</p>"
            + (f"<ul>{aside}</ul>" if aside else "") + "</section>")


def _machine_part(snap: dict) -> str:
    contrib = snap.get("contributions", {})
    session, total = contrib.get("session", {}), contrib.get("total", {})
    rows = [
        ["swarm", escape(str(snap.get("swarm", "")))],
        ["peer id", f'<code>{escape(str(snap.get("peer_id", "")))}</code>'],
        ["uptime", duration(snap.get("uptime_s"))],
        ["reachable", escape(snap.get("reachable_how") or "not yet")],
        ["device", escape(str(snap.get("compute", {}).get("device", "cpu")))],
        ["this session", f"{session.get('requests', 0)} calls, {session.get('samples', 0)} samples, "
                         f"{duration(session.get('compute_s'))} compute, {_trainers(session.get('trainers'))}"],
        ["in all", f"{total.get('requests', 0)} calls, {total.get('samples', 0)} samples, "
                   f"{duration(total.get('compute_s'))} compute, {_trainers(total.get('trainers'))}"],
    ]
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<section><h2>This machine</h2><table class="kv">{body}</table></section>'


def _experts_part(snap: dict) -> str:
    # paused, the experts are withdrawn and refuse calls: the table says so rather than look live
    serving = "withdrawn" if snap.get("paused") else "serving"
    rows = [[escape(e["uid"]), serving, str(e.get("requests", 0)), f"{e.get('requests_per_s', 0):.2f}" if not snap.get("paused") else "–",
             str(e.get("mean_batch") or "–"), str(e.get("p50_ms") or "–"), str(e.get("errors", 0)), str(e.get("version", 0))]
            for e in snap.get("experts", [])]
    listing = table(["expert", "now", "calls", "calls/s", "batch", "p50 ms", "errors", "version"], rows,
                    "no experts hosted right now", "experts")
    title = "Experts (withdrawn while paused: no calls taken)" if snap.get("paused") and rows else "Experts"
    return f"<section><h2>{title}</h2>{listing}</section>"


def _connections_part(snap: dict) -> str:
    rows = [[f'<code>…{escape(c.get("peer_id", "")[-10:])}</code>', escape(str(c.get("role", ""))), escape(str(c.get("path", ""))),
             escape(str(c.get("via") or "")[-10:]), str(c.get("rtt_ms") or "–"),
             format_size(int(c.get("bytes_in") or 0)), format_size(int(c.get("bytes_out") or 0))]
            for c in snap.get("connections", [])[:50]]
    listing = table(["peer", "role", "path", "via", "RTT ms", "in", "out"], rows, "no connections", "connections")
    return f"<section><h2>Connections</h2>{listing}</section>"


def _events_part(snap: dict) -> str:
    events = list(reversed(snap.get("conduct", {}).get("events", [])))[:12]
    items = "".join(
        f"<li>{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['time']))} <b>{escape(e['action'])}</b> "
        f"({escape(e['origin'])}){': ' + escape(e['reason']) if e.get('reason') else ''}</li>" for e in events
    )
    logs = "".join([f"<li class=\"{escape(r.get('level', '').lower())}\">{escape(str(r.get('message', ''))[:300])}</li>"
                    for r in list(reversed(snap.get("log", [])))[:20] if not r.get("event")][:8])
    return (f'<section><h2>What happened</h2><ul id="events">{items}</ul>'
            + (f"<h3>Recent warnings</h3><ul class=\"log\">{logs}</ul>" if logs else "") + "</section>")


def _hours_fmt(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 120:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def _trainers(count: object) -> str:
    return "1 trainer" if count == 1 else f"{count or 0} trainers"


def history_charts(history: History, now: float) -> str:
    """The four history plots: calls and compute per hour (last 7 days), per day (last 90)."""
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
    return '<section class="charts"><h2>Contribution history</h2>' + "".join(f"<div>{c}</div>" for c in charts) + "</section>"


def render_live(snap: dict, history: History, now: float) -> str:
    """The live part of the page (what ``/live`` returns and the script swaps in)."""
    return (_state_part(snap) + '<div class="grid">' + _policy_part(snap) + _machine_part(snap) + "</div>"
            + _experts_part(snap) + _connections_part(snap) + history_charts(history, now) + _events_part(snap))


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


def render_page(snap: dict, history: History, now: float) -> str:
    """The whole page."""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>volunteer: "
            f"{escape(str(snap.get('swarm', '')))}</title><style>{STYLE}</style></head><body>"
            f"<header>volunteer · donating to <b>{escape(str(snap.get('swarm', '')))}</b> as "
            f"…{escape(str(snap.get('peer_id', ''))[-10:])}</header>"
            f'<main id="live">{render_live(snap, history, now)}</main><script src="/app.js"></script></body></html>')


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
