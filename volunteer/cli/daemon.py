"""The CLI around a volunteer node (``volunteer join``): the control socket, the log panel's
buffer and the status snapshot the dashboard renders. The node itself (Host, NAT traversal, DHT,
experts, graceful leave) is put together by ``volunteer.node.open_volunteer``.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import trio

from .. import __version__
from ..net.events import ReachabilityChanged, RelayReservationsChanged
from ..net.nat.manager import NatManager
from ..node import JoinError, VolunteerNode, VolunteerOptions, check_device, open_volunteer
from ..swarmfile import SwarmSpec
from ..widgets import short
from ..donor import contributions as contrib
from ..donor import history as hist
from ..donor.fold import Conduct, choice_path, load_choice, save_choice
from ..donor.policy import PolicySettings
from ..donor.probes import SystemProbe
from ..donor.status import AskReply
from ..donor.steward import POLICY_PERIOD, Steward, TrafficMeter
from . import views
from .control import DaemonLock, serve_control
from .gpu import GpuMonitor
from .rates import Window
from .relaywatch import RELAY_CHECK_PERIOD, RelayWatch, silent_text, watch_relays
from .roles import classify_connections

log = logging.getLogger(__name__)

SNAPSHOT_LOG_LINES = 40  # warnings and errors a status snapshot carries (the panel shows what fits)
CHECKPOINT_SCAN_LIMIT = 1000  # directory entries looked at for the last save (a huge dir stays cheap)
CHECKPOINT_RESCAN = 5.0  # seconds between looks at the checkpoint directory
UPLOAD_KEY = "\0upload"  # the rate window's key for reply bytes (no expert uid starts with NUL)


def reachable_how(view: dict | None) -> str:
    """How others can reach this node, from its reachability view: "public", "reserved on relay
    …" (the relay's peer id, shortened), or "" while neither."""
    if not view:
        return ""
    if view.get("status") == "public":
        return "public"
    for relay in view.get("relays", []):
        if relay.get("reserved"):
            return f"reserved on relay {short(relay.get('peer_id', ''))}"
    return ""


@dataclass
class DaemonOptions:
    """Everything ``volunteer join`` decides before starting: the node's options and the CLI's own."""

    swarm: SwarmSpec
    node: VolunteerOptions
    control_path: Path | None = None
    state_dir: Path | None = None  # where contributions are kept across restarts (None: not kept)
    log_file: Path | None = None  # the event log `join` keeps (status shows where; None: none)
    policy: PolicySettings = field(default_factory=PolicySettings)  # the run-when policies
    folding: bool = True  # start serving (consent given), else start paused until `volunteer fold`
    start_reason: str = ""  # why it starts as it does (the first event of the log)
    probe: SystemProbe | None = None  # the machine's battery, load, programs and clock (None: no policies)
    policy_period: float = POLICY_PERIOD
    failure_limit: int = 5
    relay_check_period: float = RELAY_CHECK_PERIOD  # seconds between pings of each reserved relay
    on_fold: Callable[[str], None] | None = None  # told of a fold from the donor (records consent)


class LogBuffer(logging.Handler):
    """Keeps the last warnings and errors for the dashboard's log panel."""

    def __init__(self, size: int = 50) -> None:
        super().__init__(logging.WARNING)
        self.records: collections.deque = collections.deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            entry = {"time": record.created, "level": record.levelname, "message": record.getMessage()}
            if getattr(record, "conduct_event", False):  # fold/pause/finish: the event log shows them already
                entry["event"] = True
            self.records.append(entry)
        except Exception:  # a log record that cannot format must not break the daemon
            pass


class Daemon:
    """One volunteer under the CLI: run it with ``await nursery.start(daemon.run)``; ``leave()``
    ends it gracefully."""

    def __init__(self, options: DaemonOptions, *, control_lock: DaemonLock | None = None) -> None:
        self.options = options
        self.control_lock = control_lock  # "a daemon runs here", taken by `join` (None: taken with the socket)
        self.swarm = options.swarm
        self.started = time.time()
        self.node: VolunteerNode | None = None
        self.logs = LogBuffer()
        self._leave_asked = False
        self._left = trio.Event()
        self.window = Window()  # req/s, batch and upload over the last RATE_WINDOW seconds
        self.gpu = GpuMonitor()
        self._checkpoints: tuple[float, dict] | None = None  # (when scanned, view)
        probe = options.probe
        self.clock: Callable[[], float] = probe.now if probe is not None else time.time
        self._history_path = (
            hist.history_path(options.state_dir, options.swarm.id) if options.state_dir is not None else None
        )
        # the one record of what this volunteer gave: hours, days, months, session, lifetime
        self.history = hist.load(self._history_path) if self._history_path is not None else hist.History()
        if options.state_dir is not None:  # an older version's separate lifetime totals, folded in once
            hist.adopt_legacy_totals(self.history, hist.legacy_path(options.state_dir, options.swarm.id))
        self._history_deltas = hist.Deltas()
        self.traffic = TrafficMeter()
        self._choice_path = choice_path(options.state_dir, options.swarm.id) if options.state_dir is not None else None
        # a pause or finish the donor chose outlives the daemon, until `volunteer fold` (consent
        # not yet given comes first: that start is paused anyway)
        kept = load_choice(self._choice_path) if self._choice_path is not None and options.folding else None
        if kept is not None:
            self.conduct = Conduct.kept(kept, now=self.clock())
            options.node.start_paused = True  # nothing is declared before the steward looks
        else:
            self.conduct = Conduct(folding=options.folding, origin="start" if options.folding else "consent",
                                   reason=options.start_reason, now=self.clock())
        # no consent yet: nothing is dialled, joined, placed or downloaded until the donor folds
        # (Folding@home fetches nothing before a yes); the control socket and the page answer meanwhile
        self.awaiting_consent = not options.folding
        self._wake = trio.Event()  # a fold while awaiting consent, or a leave
        self.joined = trio.Event()  # the node is up (at once, or after the consent)
        self.steward = Steward(self.conduct, options.policy, probe, period=options.policy_period,
                               failure_limit=options.failure_limit, transferred_today=self._transferred_today,
                               on_fold=options.on_fold, on_choice=self._keep_choice)
        self.reachable_after_s: float | None = None  # from the start of run() to public or reserved
        self.reachable_how = ""
        self.reachable = trio.Event()
        self.relay_watch = RelayWatch()  # whether the relays we hold reservations on still answer
        self.web_url: str | None = None  # the local web page's address, once it is served
        self.web_login: str | None = None  # ... and the link that logs a browser in (it holds the token)
        self._save_warned = False
        logging.getLogger().addHandler(self.logs)

    @property
    def device(self) -> str:
        """The device the experts run on (``cpu`` before the node starts)."""
        return self.node.device if self.node is not None else "cpu"

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start the node and the control socket; return once the node has left."""
        started = False
        try:
            async with trio.open_nursery() as nursery:
                if self.awaiting_consent:
                    await nursery.start(self._serve_control)
                    task_status.started(self)
                    started = True
                    await self._wake.wait()
                if not self._leave_asked or not self.awaiting_consent:  # a leave before the consent joins nothing
                    await self._join(nursery, started, task_status)
                # the control socket answers until the node has left: `status` shows the leave
                nursery.cancel_scope.cancel()
        finally:
            logging.getLogger().removeHandler(self.logs)
            self._save_contributions()
            self._left.set()

    async def _join(self, nursery: trio.Nursery, started: bool, task_status) -> None:
        began = trio.current_time()
        # the run-when policies are looked at before anything is declared: a start outside the
        # network hours or on battery is paused from its first moment, not a sample later
        paused = self.options.node.start_paused or not self.first_verdict()
        # each call answered with a result counts its caller among the trainers served; each
        # call's outcome tells self-care which expert keeps failing
        options = replace(self.options.node, on_served=self._served, on_outcome=self.steward.outcome, start_paused=paused)
        async with open_volunteer(self.swarm, options) as node:
            self.node = node
            if self._leave_asked:  # a signal that came while the node was starting
                node.leave()
            nursery.start_soon(self._watch_reachable, began)
            nursery.start_soon(self._watch_relays)
            await nursery.start(self.steward.run, node)
            if not started:
                await nursery.start(self._serve_control)
            nursery.start_soon(self._keep_contributions)
            self.joined.set()
            if not started:
                task_status.started(self)
            await node.wait_leave()
            self._observe_contributions()  # the last requests of the session count too

    def first_verdict(self) -> bool:
        """Sample the run-when policies once, before the node starts; whether it may serve."""
        if self.options.probe is not None:
            self.steward.sample()
        return self.conduct.serving

    async def _keep_contributions(self) -> None:
        """Save the contributions every SAVE_PERIOD seconds, so a crash loses a minute at most."""
        while True:
            await trio.sleep(contrib.SAVE_PERIOD)
            self._observe_contributions()
            self._save_contributions()

    def _served(self, peer, _op: str) -> None:
        self.history.served(self.clock(), str(peer))

    def _observe_contributions(self) -> None:
        node = self.node
        if node is None:
            return
        now = self.clock()
        counters: dict[str, float] = {"traffic": 0.0}
        if node.hosts_experts:
            stats = node.expert_stats()
            for uid, s in stats.items():  # per expert: one handed off or set aside takes its counts along
                on_gpu = node.expert_on_gpu(uid)
                counters[f"calls {uid}"] = s.requests - s.errors
                counters[f"samples {uid}"] = s.samples
                counters[f"{'gpu' if on_gpu else 'cpu'}_s {uid}"] = s.compute_s
            counters["bytes_sent"] = views.bytes_served(node)
        grown = self._history_deltas.step(counters)
        figures: dict[str, float] = {"traffic": self.traffic.step(node.host.connections())}
        for key, value in grown.items():
            name = key.split(" ", 1)[0]
            if name != "traffic" and value > 0:
                figures[name] = figures.get(name, 0) + value
        self.history.add(now, figures)
        self.history.tick(now, serving=self.conduct.serving)

    def _keep_choice(self, conduct: Conduct) -> None:
        """Keep the donor's pause or finish for the next start (forget it on a fold)."""
        if self._choice_path is not None:
            save_choice(self._choice_path, conduct)

    def _transferred_today(self, now: float) -> int:
        self._observe_contributions()
        return self.history.today(now).traffic

    def _save_contributions(self) -> None:
        failed = []
        if self._history_path is not None and not hist.save(self._history_path, self.history):
            failed.append(self._history_path)
        if failed and not self._save_warned:
            self._save_warned = True
            log.warning("cannot save contributions to %s (they are still counted for this session)", failed[0])

    async def _serve_control(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.options.control_path is None:
            task_status.started()
            return
        await serve_control(self.options.control_path, self.handle_control, lock=self.control_lock,
                            task_status=task_status)

    async def _watch_reachable(self, began: float) -> None:
        # looked at again whenever the verdict or the relay reservations change, until reachable
        node = self.node
        if node is None:
            return
        with node.host.events.subscribe(ReachabilityChanged, RelayReservationsChanged) as changes:
            how = reachable_how(views.reachability_view(node))
            if not how:
                async for _ in changes:
                    if how := reachable_how(views.reachability_view(node)):
                        break
                else:
                    return  # the host closed before this node became reachable
        # the moment the NAT manager saw it happen: this watcher starts only once every service
        # has (the DHT's bootstrap among them), and the reservation is usually made long before
        manager = node.host.service(NatManager)
        at = manager.reachable_at if manager is not None and manager.reachable_at is not None else trio.current_time()
        self.reachable_after_s = round(max(0.0, at - began), 2)
        self.reachable_how = how
        log.info("reachable after %.1f s: %s", self.reachable_after_s, how)
        self.reachable.set()

    async def _watch_relays(self) -> None:
        node = self.node
        if node is None or node.host.service(NatManager) is None:
            return

        def reserved() -> list[str]:
            return relays_to_ping(node)

        def connection_to(peer: str):
            for conn in node.host.connections():
                if str(conn.remote_peer) == peer and not conn.is_closed and not conn.remote_addr.is_relayed():
                    return conn
            return None

        await watch_relays(reserved, connection_to, self.relay_watch, period=self.options.relay_check_period)

    def leave(self) -> None:
        """Start a graceful leave (Ctrl-C, SIGTERM, ``volunteer stop``)."""
        self._leave_asked = True
        self._wake.set()
        if self.node is not None:
            self.node.leave()

    async def wait_left(self) -> None:
        """Until the node has left and ``run`` returned."""
        await self._left.wait()

    # --- control ---------------------------------------------------------------------------------
    async def handle_control(self, request: dict) -> dict:
        """Answer one control-socket request: status, fold (resume), pause, finish, leave."""
        cmd = request.get("cmd")
        if cmd == "status":
            return {"ok": True, "status": self.snapshot()}
        if cmd in ("fold", "resume", "pause", "finish"):
            return dict(await self.ask("fold" if cmd == "resume" else cmd, "cli"))
        if cmd == "leave":
            self.leave()
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {str(cmd)[:32]!r}"}

    async def ask(self, action: str, origin: str) -> "dict | AskReply":
        """fold / pause / finish from ``origin`` (cli, web). Before the donor's consent only a fold
        does anything: it records the consent and joins the swarm (the reply comes at once, the
        join goes on); pause and finish leave a daemon that joined nothing as it is."""
        if self.node is None and self.awaiting_consent:
            if action != "fold":
                return {"ok": True, "paused": True, "state": self.conduct.state, "text": self.conduct.text,
                        "changed": False}
            reply = await self.steward.ask("fold", origin)
            self._wake.set()
            return {**reply, "text": f"{reply['text']}; joining the swarm"}
        if self.node is None:  # the control socket opens once the node is up, or before a consent
            return {"ok": False, "error": "the node is not running"}
        return await self.steward.ask(action, origin)

    # --- status ----------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The status every view shows (dashboard, ``volunteer status --json``); JSON-serialisable."""
        node = self.node
        host = node.host if node is not None else None
        keypair = self.options.node.keypair
        snap: dict = {
            "version": __version__,
            "peer_id": str(host.peer_id) if host is not None else str(keypair.peer_id) if keypair else "",
            "pid": os.getpid(),
            "swarm": self.swarm.name,
            "swarm_id": self.swarm.id,
            "uptime_s": round(time.time() - self.started, 1),
            "paused": node.paused if node is not None else not self.conduct.serving,
            "state": self.conduct.state,
            "state_text": self.steward.state_text(),
            "listen_addrs": [str(a) for a in host.full_addrs()] if host else [],
            "reachable_after_s": self.reachable_after_s,
            "reachable_how": self.reachable_how,
            # False while a daemon without consent waits: no host, no DHT, nothing fetched
            "joined": node is not None,
        }
        now = trio.current_time()
        if node is not None:
            reachability = views.reachability_view(node)
            if reachability is not None:
                for relay in reachability["relays"]:
                    if relay.get("reserved"):
                        relay.update(self.relay_watch.view(relay.get("peer_id", ""), now))
                snap["reachability"] = reachability
                silent = silent_text(reachability["relays"])
                if silent:  # a dead relay's reservation reaches nobody: say so wherever the state shows
                    snap["relay_warning"] = silent
                    snap["state_text"] = f"{snap['state_text']}; {silent}"
                    snap["reachable_how"] = f"{self.reachable_how or 'not yet'}, but {silent}"
            served = self.history.session.trainers
            snap["connections"] = classify_connections(views.connections_view(node.host), node.host, self.swarm.id,
                                                       reachability, served)
            snap["dht"] = views.dht_view(node)
        snap["experts"] = self._windowed(views.expert_rows(node, now), now) if node is not None else []
        coverage = views.coverage_view(node) if node is not None else None
        if coverage is not None:  # the swarm declares grids: replicas per expert, unhosted ones
            snap["coverage"] = coverage
        snap["compute"] = views.compute_view(node.device) if node is not None else {"device": "cpu"}
        snap["gpu"] = self.gpu.read(self.device)
        if node is not None:
            self._observe_contributions()
            snap["upload"] = self._upload(now)
            snap["refusals"] = views.refusals_view(node)
            report = node.trainer_report()
            if node.server is not None and report is not None:  # who trains our experts, and how it went
                snap["trainers"] = {"policy": node.server.snapshot().get("trainer_policy"), **report}
            if node.options.hosts_experts:
                snap["checkpoints"] = self._checkpoint_view(node.options.checkpoint_dir, now)
        snap["contributions"] = self.history.contributions_view()
        snap.update(self.steward.snapshot())
        if self.options.log_file is not None:
            snap["log_file"] = str(self.options.log_file)
        if self.web_url is not None:  # the control socket is the user's alone: the login link may go there
            snap["web"] = {"url": self.web_url, "login": self.web_login}
        snap["log"] = list(self.logs.records)[-SNAPSHOT_LOG_LINES:]
        return snap

    def _windowed(self, rows: list[dict], now: float) -> list[dict]:
        """Replace the rows' rates with figures over the last RATE_WINDOW seconds: requests per
        second and samples per batch alike (a lifetime mean hides a trainer that just changed)."""
        node = self.node
        stats = node.expert_stats() if node is not None else {}
        for row in rows:
            uid = row.get("uid")
            s = stats.get(uid) if isinstance(uid, str) else None
            if s is None:
                continue
            self.window.observe(s.uid, now, s.requests, s.samples, s.batches)
            rate = self.window.rate(s.uid, 0)
            batch = self.window.ratio(s.uid, 1, 2)
            row["requests_per_s"] = round(rate, 2) if rate is not None else 0.0
            row["mean_batch"] = round(batch, 2) if batch is not None else None
            row["window_s"] = self.window.span
        self.window.forget(set(stats) | {UPLOAD_KEY})
        return rows

    def _upload(self, now: float) -> dict:
        """Upload bytes per second over the window (replies and replica traffic), against ``--max-upload``,
        and the bytes sent by purpose (``by_purpose``: replies, sync, catch_up, hand_off)."""
        node = self.node
        sent = views.bytes_served(node) if node is not None else 0
        self.window.observe(UPLOAD_KEY, now, sent)
        rate = self.window.rate(UPLOAD_KEY)
        limit = node.options.max_upload if node is not None else None
        # the README's promise: status --json counts each kind of upload apart (replies, sync, catch-up, hand-off)
        meter = node.server.snapshot().get("upload") if node is not None and node.server is not None else None
        by_purpose = dict(meter.get("by_purpose") or {}) if isinstance(meter, dict) else {}
        return {"rate_bps": round(rate, 1) if rate is not None else 0.0, "limit_bps": limit, "bytes_sent": sent,
                "by_purpose": by_purpose}

    def _checkpoint_view(self, directory: Path | None, now: float) -> dict:
        """Where checkpoints go, whether that is writable and how long since the last save."""
        if self._checkpoints is not None and now - self._checkpoints[0] < CHECKPOINT_RESCAN:
            view = dict(self._checkpoints[1])
        else:
            view = checkpoint_view(directory)
            self._checkpoints = (now, view)
        if view.get("last_save") is not None:
            view["last_save_age_s"] = round(max(0.0, time.time() - view["last_save"]), 1)
        return view


def relays_to_ping(node) -> list[str]:
    """The relays the node holds a reservation on, whose answers the relay watch checks; none
    while the node is paused: a paused volunteer uses no network it can do without (BOINC stops
    all network use outside network hours), and its relay pings are one such use."""
    if node.paused:
        return []
    view = views.reachability_view(node) or {}
    return [r["peer_id"] for r in view.get("relays", []) if r.get("reserved") and r.get("peer_id")]


def checkpoint_view(directory: Path | None) -> dict:
    """``{"dir", "writable", "last_save"}`` of a checkpoint directory (``last_save``: the newest
    file's mtime, None when it holds none; a directory not made yet is writable if its parent is)."""
    if directory is None:
        return {"dir": None, "writable": False, "last_save": None}
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    newest = None
    try:
        with os.scandir(directory) as entries:
            for index, entry in enumerate(entries):
                if index >= CHECKPOINT_SCAN_LIMIT:
                    break
                if entry.is_file():
                    mtime = entry.stat().st_mtime
                    newest = mtime if newest is None else max(newest, mtime)
    except OSError:
        pass
    return {"dir": str(directory), "writable": os.access(existing, os.W_OK | os.X_OK), "last_save": newest}


__all__ = ["Daemon", "DaemonOptions", "JoinError", "LogBuffer", "check_device", "relays_to_ping"]
