"""The CLI around a volunteer node (``volunteer join``): the control socket, the log panel's
buffer and the status snapshot the dashboard renders. The node itself (Host, NAT traversal, DHT,
experts, graceful leave) is put together by ``volunteer.node.open_volunteer``.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from .. import __version__
from ..node import JoinError, VolunteerNode, VolunteerOptions, check_device, open_volunteer
from ..swarmfile import SwarmSpec
from .control import serve_control

log = logging.getLogger(__name__)

SNAPSHOT_LOG_LINES = 10  # warnings and errors a status snapshot carries for the log panel
REACHABLE_POLL = 0.1  # seconds between looks at the node's reachability until it is reachable


def reachable_how(view: dict | None) -> str:
    """How others can reach this node, from its reachability view: "public", "reserved on relay
    …" (the relay's peer id, shortened), or "" while neither."""
    if not view:
        return ""
    if view.get("status") == "public":
        return "public"
    for relay in view.get("relays", []):
        if relay.get("reserved"):
            return f"reserved on relay …{relay.get('peer_id', '')[-6:]}"
    return ""


@dataclass
class DaemonOptions:
    """Everything ``volunteer join`` decides before starting: the node's options and the CLI's own."""

    swarm: SwarmSpec
    node: VolunteerOptions
    control_path: Path | None = None


class LogBuffer(logging.Handler):
    """Keeps the last warnings and errors for the dashboard's log panel."""

    def __init__(self, size: int = 50) -> None:
        super().__init__(logging.WARNING)
        self.records: collections.deque = collections.deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append({"time": record.created, "level": record.levelname, "message": record.getMessage()})
        except Exception:  # a log record that cannot format must not break the daemon
            pass


class Daemon:
    """One volunteer under the CLI: run it with ``await nursery.start(daemon.run)``; ``leave()``
    ends it gracefully."""

    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.swarm = options.swarm
        self.started = time.time()
        self.node: VolunteerNode | None = None
        self.logs = LogBuffer()
        self._leave_asked = False
        self._left = trio.Event()
        self.reachable_after_s: float | None = None  # from the start of run() to public or reserved
        self.reachable_how = ""
        self.reachable = trio.Event()
        logging.getLogger().addHandler(self.logs)

    @property
    def device(self) -> str:
        """The device the experts run on (``cpu`` before the node starts)."""
        return self.node.device if self.node is not None else "cpu"

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start the node and the control socket; return once the node has left."""
        began = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                async with open_volunteer(self.swarm, self.options.node) as node:
                    self.node = node
                    if self._leave_asked:  # a signal that came while the node was starting
                        node.leave()
                    nursery.start_soon(self._watch_reachable, began)
                    await nursery.start(self._serve_control)
                    task_status.started(self)
                    await node.wait_leave()
                # the control socket answers until the node has left: `status` shows the leave
                nursery.cancel_scope.cancel()
        finally:
            logging.getLogger().removeHandler(self.logs)
            self._left.set()

    async def _serve_control(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.options.control_path is None:
            task_status.started()
            return
        await serve_control(self.options.control_path, self.handle_control, task_status=task_status)

    async def _watch_reachable(self, began: float) -> None:
        # the node publishes no event for "reservation held": look until reachable, then stop
        while self.node is not None:
            how = reachable_how(self.node.reachability_view())
            if how:
                self.reachable_after_s = round(trio.current_time() - began, 2)
                self.reachable_how = how
                log.info("reachable after %.1f s: %s", self.reachable_after_s, how)
                self.reachable.set()
                return
            await trio.sleep(REACHABLE_POLL)

    def leave(self) -> None:
        """Start a graceful leave (Ctrl-C, SIGTERM, ``volunteer stop``)."""
        self._leave_asked = True
        if self.node is not None:
            self.node.leave()

    async def wait_left(self) -> None:
        """Until the node has left and ``run`` returned."""
        await self._left.wait()

    # --- control ---------------------------------------------------------------------------------
    async def handle_control(self, request: dict) -> dict:
        """Answer one control-socket request (status, pause, resume, leave)."""
        cmd = request.get("cmd")
        if cmd == "status":
            return {"ok": True, "status": self.snapshot()}
        if self.node is None:  # the control socket only opens once the node is up
            return {"ok": False, "error": "the node is not running"}
        if cmd == "pause":
            await self.node.pause()
            return {"ok": True, "paused": True}
        if cmd == "resume":
            self.node.resume()
            return {"ok": True, "paused": False}
        if cmd == "leave":
            self.leave()
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {str(cmd)[:32]!r}"}

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
            "paused": node.paused if node is not None else False,
            "listen_addrs": [str(a) for a in host.full_addrs()] if host else [],
            "reachable_after_s": self.reachable_after_s,
            "reachable_how": self.reachable_how,
        }
        if node is not None:
            reachability = node.reachability_view()
            if reachability is not None:
                snap["reachability"] = reachability
            snap["connections"] = node.connections_view()
            dht = node.dht_view()
            if dht is not None:
                snap["dht"] = dht
        snap["experts"] = node.expert_rows(trio.current_time()) if node is not None else []
        snap["compute"] = node.compute_view() if node is not None else {"device": "cpu"}
        snap["log"] = list(self.logs.records)[-SNAPSHOT_LOG_LINES:]
        return snap


__all__ = ["Daemon", "DaemonOptions", "JoinError", "LogBuffer", "check_device"]
