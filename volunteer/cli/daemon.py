"""The volunteer daemon behind ``volunteer join``: wires Host, NAT traversal, DHT, experts and the
control socket together, and leaves gracefully.

Start-up order matters for a user who watches it: listen (a busy port fails at once), reach the
swarm (no answer from any bootstrap peer or relay fails with one line), then AutoNAT decides
public or private (private: relay reservations, DHT client mode), then the experts are loaded
(checkpoints resumed) and declared. ``leave()`` reverses it: tombstones first (trainers stop
picking us at once), then in-flight requests finish within a deadline, then checkpoints.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from .. import __version__
from ..dht import DHTConfig
from ..dht.declare import ExpertDeclarer
from ..dht.node import open_dht
from ..errors import DialError, ExpertConfigError, VolunteerError, describe
from ..net.host import HostConfig, open_host
from ..net.identity import KeyPair
from ..net.multiaddr import Multiaddr
from ..net.nat.autonat import Reachability
from ..net.nat.manager import NatManager
from ..swarmfile import SwarmSpec
from .control import serve_control

log = logging.getLogger(__name__)

JOIN_TIMEOUT = 20.0  # a swarm none of whose entry points answers by then is "unreachable"
LEAVE_DEADLINE = 10.0  # in-flight expert requests get this long to finish on a graceful leave


class JoinError(VolunteerError):
    """The daemon cannot start: swarm unreachable, bad expert settings, missing device."""


@dataclass
class DaemonOptions:
    """Everything ``volunteer join`` decides before starting."""

    swarm: SwarmSpec
    keypair: KeyPair
    listen: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    expert_class: str | None = None
    uids: list[str] = field(default_factory=list)
    hidden_dim: int = 64
    device: str = "auto"
    max_batch: int = 1024
    checkpoint_dir: Path | None = None
    control_path: Path | None = None
    max_gpu_memory: float | None = None  # fraction of the GPU's memory torch may take
    max_upload: float | None = None  # bytes per second of expert replies
    expert_file: str | None = None  # a Python file defining custom expert classes
    dht_config: DHTConfig | None = None
    nat_servers: list[Multiaddr] | None = None  # default: the swarm's entry points
    mdns: bool = True  # find volunteers of the same swarm on the LAN
    share_tracebacks: str = "redacted"  # what our expert errors show trainers: full, redacted, none


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


def check_device(device: str, max_gpu_memory: float | None) -> str:
    """Resolve ``auto`` and refuse a CUDA device torch cannot see, with what to do instead."""
    import torch

    from ..experts.backend import resolve_device

    resolved = resolve_device(device)
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = resolved.index or 0
        if index >= count:
            raise JoinError(f"no CUDA device {resolved} (torch sees {count} CUDA device(s)); use --device cpu or auto")
        if max_gpu_memory:
            torch.cuda.set_per_process_memory_fraction(max_gpu_memory, index)
    return str(resolved)


class Daemon:
    """One volunteer: run it with ``await nursery.start(daemon.run)``; ``leave()`` ends it gracefully."""

    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.swarm = options.swarm
        self.started = time.time()
        self.host = None
        self.dht = None
        self.nat: NatManager | None = None
        self.runtime = None
        self.server = None
        self.declarer: ExpertDeclarer | None = None
        self.device = "cpu"
        self.paused = False
        self.logs = LogBuffer()
        self._leave = trio.Event()
        self._left = trio.Event()
        self._last_counts: dict[str, tuple[float, int]] = {}
        logging.getLogger().addHandler(self.logs)

    # --- lifecycle -------------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        opts = self.options
        if opts.uids:
            self.device = check_device(opts.device, opts.max_gpu_memory)
        config = HostConfig()
        dht_config = opts.dht_config or DHTConfig(swarm_id=self.swarm.id)
        try:
            async with open_host(opts.keypair, opts.listen, config=config) as host:
                self.host = host
                await self._reach_swarm(host)
                async with trio.open_nursery() as nursery, open_dht(
                    host, dht_config, bootstrap=self.swarm.entry_points, client_mode=False
                ) as dht:
                    self.dht = dht
                    servers = opts.nat_servers if opts.nat_servers is not None else self.swarm.entry_points
                    self.nat = NatManager(host, servers, self.swarm.relays)
                    await host.add_service(self.nat)
                    nursery.start_soon(self._follow_reachability)
                    if opts.mdns:
                        nursery.start_soon(self._discover_lan, nursery)
                    await self._serve_experts(nursery, task_status)
                    nursery.cancel_scope.cancel()
        finally:
            logging.getLogger().removeHandler(self.logs)
            self._left.set()

    async def _reach_swarm(self, host) -> None:
        entry = self.swarm.entry_points
        if not entry:
            return  # the first node of a new swarm: others will bootstrap from us
        failures = {}
        reached = False

        async def one(addr: Multiaddr) -> None:
            nonlocal reached
            try:
                with trio.fail_after(JOIN_TIMEOUT):
                    await host.connect(addr)
                reached = True
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                failures[str(addr)] = describe(exc)

        async with trio.open_nursery() as nursery:
            for addr in entry:
                nursery.start_soon(one, addr)
        if not reached:
            first = next(iter(failures.items()))
            raise JoinError(
                f"cannot reach swarm {self.swarm.name!r}: none of its {len(entry)} bootstrap peers/relays answered "
                f"({first[0]}: {first[1]})"
            )

    async def _serve_experts(self, nursery: trio.Nursery, task_status) -> None:
        opts = self.options
        if not opts.uids:
            await nursery.start(self._serve_control)
            task_status.started(self)
            await self._leave.wait()
            return
        from ..experts import ExpertsConfig, make_backend, open_runtime
        from ..experts.server import ExpertServer

        if opts.expert_file:
            from ..experts import load_expert_file

            load_expert_file(opts.expert_file)
        experts_config = ExpertsConfig(
            device=self.device, max_batch_size=opts.max_batch, share_tracebacks=opts.share_tracebacks
        )
        try:
            backends = [
                make_backend(uid, opts.expert_class, opts.hidden_dim, config=experts_config, checkpoint_dir=opts.checkpoint_dir)
                for uid in opts.uids
            ]
        except (ExpertConfigError, KeyError, ValueError) as exc:
            raise JoinError(f"cannot build experts: {describe(exc)}") from None
        async with open_runtime(backends, experts_config) as runtime:
            self.runtime = runtime
            self.server = ExpertServer(self.host, runtime, self.swarm.id, experts_config)
            if opts.max_upload:
                self.server.upload_limit = opts.max_upload
            self.server.install()
            self.declarer = ExpertDeclarer(self.dht, runtime.uids, loads=self._loads)
            await nursery.start(self.declarer.run)
            await nursery.start(self._serve_control)
            task_status.started(self)
            await self._leave.wait()
            # graceful leave: vanish from lookups, refuse new work, let running work finish
            with trio.move_on_after(3):
                await self.declarer.withdraw()
            self.declarer.uids = []  # nothing left to declare or withdraw when the task ends
            runtime.pause()
            with trio.move_on_after(LEAVE_DEADLINE):
                while self._in_flight():
                    await trio.sleep(0.05)
        # leaving the runtime's block saved every checkpoint

    def _in_flight(self) -> int:
        busy = getattr(self.server, "active_requests", 0) if self.server else 0
        queued = sum(s.queued for s in self.runtime.stats().values()) if self.runtime else 0
        return busy + queued

    def _loads(self) -> dict[str, float]:
        if self.runtime is None:
            return {}
        return {uid: float(s.queued) for uid, s in self.runtime.stats().items()}

    async def _discover_lan(self, nursery: trio.Nursery) -> None:
        # peers found by mDNS are pinged by the DHT: those of our swarm join the routing table
        from ..dht.mdns import MdnsDiscovery
        from ..net.identity import PeerID

        def found(peer: str, addrs: list[str]) -> None:
            try:
                parsed = [Multiaddr(a) for a in addrs]
                nursery.start_soon(self.dht.add_peer, PeerID.from_string(peer), parsed)
            except VolunteerError as exc:
                log.debug("mDNS: ignoring %s: %s", peer, describe(exc))

        def ours() -> list[str]:
            return [str(a.with_peer_id(self.host.peer_id)) for a in self.host.shareable_addrs() if not a.is_relayed()]

        discovery = MdnsDiscovery(str(self.host.peer_id), ours, found)
        try:
            await discovery.run()
        except OSError as exc:  # no multicast-capable interface: the swarm's bootstrap peers still work
            log.warning("LAN discovery (mDNS) is off: %s", exc)

    async def _follow_reachability(self) -> None:
        # private volunteers run the DHT in client mode: routing others to them would fail
        while True:
            private = self.nat.reachability is Reachability.PRIVATE
            if self.dht.client_mode != private:
                log.info("DHT %s mode (reachability: %s)", "client" if private else "server", self.nat.reachability.value)
                self.dht.set_client_mode(private)
            await trio.sleep(1)

    async def _serve_control(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.options.control_path is None:
            task_status.started()
            return
        await serve_control(self.options.control_path, self.handle_control, task_status=task_status)

    def leave(self) -> None:
        """Start a graceful leave (Ctrl-C, SIGTERM, ``volunteer stop``)."""
        self._leave.set()

    async def wait_left(self) -> None:
        await self._left.wait()

    # --- control ---------------------------------------------------------------------------------
    async def handle_control(self, request: dict) -> dict:
        cmd = request.get("cmd")
        if cmd == "status":
            return {"ok": True, "status": self.snapshot()}
        if cmd == "pause":
            await self.pause()
            return {"ok": True, "paused": True}
        if cmd == "resume":
            self.resume()
            return {"ok": True, "paused": False}
        if cmd == "leave":
            self.leave()
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {str(cmd)[:32]!r}"}

    async def pause(self) -> None:
        """Stop taking expert requests and drop out of lookups at once; keep identity and connections."""
        self.paused = True
        if self.runtime is not None:
            self.runtime.pause()
        if self.declarer is not None:
            await self.declarer.pause()
        log.warning("paused: experts withdrawn from the DHT, new requests refused")

    def resume(self) -> None:
        self.paused = False
        if self.runtime is not None:
            self.runtime.resume()
        if self.declarer is not None:
            self.declarer.resume()
        log.warning("resumed: experts declared again")

    # --- status ----------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The status every view shows (dashboard, ``volunteer status --json``); JSON-serialisable."""
        host = self.host
        snap: dict = {
            "version": __version__,
            "peer_id": str(self.options.keypair.peer_id),
            "pid": os.getpid(),
            "swarm": self.swarm.name,
            "swarm_id": self.swarm.id,
            "uptime_s": round(time.time() - self.started, 1),
            "paused": self.paused,
            "listen_addrs": [str(a) for a in host.full_addrs()] if host else [],
        }
        if self.nat is not None:
            nat = self.nat.snapshot()
            snap["reachability"] = {
                "status": nat["reachability"],
                "nat_type": nat["mapping"],
                "observed_addrs": nat["observed_addrs"],
                "relays": [
                    {
                        "peer_id": str(Multiaddr(r["addr"]).peer_id or ""),
                        "addr": r["addr"],
                        "rtt_ms": r["rtt_ms"],
                        "expires_in_s": r["expires_in"],
                        "reserved": r["reserved"],
                        "error": r["error"],
                    }
                    for r in nat["relays"]
                ],
            }
        if host is not None:
            conns = []
            for conn in host.connections():
                if conn.is_closed:
                    continue
                relay = conn.remote_addr.relay_parts() if conn.remote_addr.is_relayed() else None
                conns.append(
                    {
                        "peer_id": str(conn.remote_peer),
                        "path": conn.path.value if hasattr(conn.path, "value") else str(conn.path),
                        "via": str(relay[1]) if relay and relay[1] else None,
                        "rtt_ms": round(conn.rtt * 1000, 2) if conn.rtt else None,
                        "bytes_in": conn.bytes_received,
                        "bytes_out": conn.bytes_sent,
                        "addr": str(conn.remote_addr),
                        "agent": getattr(host.peerstore.get(conn.remote_peer), "agent_version", None),
                    }
                )
            snap["connections"] = conns
        if self.dht is not None:
            dht = self.dht.snapshot()
            last = self.declarer.last_declared if self.declarer else None
            dht["last_declared_age_s"] = round(self.dht.clock() - last, 1) if last else None
            dht["experts_declared"] = len(self.declarer.uids) if self.declarer and not self.paused else 0
            snap["dht"] = dht
        snap["experts"] = self._expert_rows()
        snap["compute"] = self._compute()
        snap["log"] = list(self.logs.records)[-10:]
        return snap

    def _expert_rows(self) -> list[dict]:
        if self.runtime is None:
            return []
        rows = []
        now = time.monotonic()
        for uid, s in sorted(self.runtime.stats().items()):
            then, count = self._last_counts.get(uid, (self.started_monotonic, 0))
            rate = (s.requests - count) / (now - then) if now > then else 0.0
            self._last_counts[uid] = (now, s.requests)
            rows.append(
                {
                    "uid": uid,
                    "requests": s.requests,
                    "requests_per_s": round(rate, 2),
                    "mean_batch": round(s.mean_batch_size, 2),
                    "p50_ms": round(s.latency_p50 * 1000, 2) if s.latency_p50 is not None else None,
                    "p95_ms": round(s.latency_p95 * 1000, 2) if s.latency_p95 is not None else None,
                    "errors": s.errors,
                    "busy": s.busy,
                    "updates": s.updates,
                    "last_error": s.last_error,
                }
            )
        return rows

    @property
    def started_monotonic(self) -> float:
        return time.monotonic() - (time.time() - self.started)

    def _compute(self) -> dict:
        info: dict = {"device": self.device, "utilization_pct": None, "memory_used_mb": None, "memory_total_mb": None}
        if self.device.startswith("cuda"):
            try:
                import torch

                free, total = torch.cuda.mem_get_info(torch.device(self.device))
                info["memory_used_mb"] = round((total - free) / 2**20)
                info["memory_total_mb"] = round(total / 2**20)
                info["utilization_pct"] = torch.cuda.utilization(torch.device(self.device))
            except Exception:  # utilisation needs pynvml; memory figures alone still help
                pass
        return info


__all__ = ["Daemon", "DaemonOptions", "JoinError", "check_device"]
