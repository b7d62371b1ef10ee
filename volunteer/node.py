"""The one place a volunteer node is put together: ``open_volunteer(spec, options)``.

    async with open_volunteer(spec, VolunteerOptions(uids=["ffn.0.0"], expert_class="ffn")) as node:
        await node.wait_leave()          # Ctrl-C, `volunteer stop`, a test: node.leave()
    # leaving the block left gracefully: tombstones, in-flight work finished, checkpoints saved

Start-up order matters for a user who watches it: listen (a busy port fails at once), reach the
swarm (no answer from any bootstrap peer or relay fails with one line), then AutoNAT decides
public or private (private: relay reservations, DHT client mode), then the experts are loaded
(checkpoints resumed) and declared. A clean exit from the block reverses it: tombstones first
(trainers stop picking us at once), then in-flight requests finish within a deadline, then
checkpoints. An exception or cancellation skips the waiting and only tears down (the declarer
still tries a short withdraw, the runtime still saves its checkpoints).

The CLI daemon (``volunteer join``), the test fixtures and the benchmarks all start volunteers
here; ``Swarm`` beside it is the trainer's side.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .dht import DHTConfig
from .dht.declare import ExpertDeclarer
from .dht.node import open_dht
from .errors import ExpertConfigError, VolunteerError, describe
from .net.config import HostConfig
from .net.events import ReachabilityChanged
from .net.identity import KeyPair, PeerID
from .net.multiaddr import Multiaddr
from .net.nat.autonat import Reachability
from .net.nat.manager import NatManager
from .net.resources import ResourceLimits, ResourceManager
from .net.stack import StackOptions, open_stack
from .swarmfile import EXPERT_LIMITS, SwarmSpec

if TYPE_CHECKING:  # the experts (and torch) load only when a node hosts experts
    from .experts import ExpertsConfig
    from .experts.backend import ExpertBackend
    from .replicas import HandOffResult, ReplicasConfig
    from .replicas.manager import ReplicaManager
    from .experts.runtime import Runtime
    from .experts.server import ExpertServer
    from .net.host import Host

log = logging.getLogger(__name__)

REACH_TIMEOUT = 20.0  # a swarm none of whose entry points answers by then is "unreachable"
LEAVE_DEADLINE = 10.0  # in-flight expert requests get this long to finish on a graceful leave
WITHDRAW_DEADLINE = 3.0  # tombstones that have not reached the DHT by then are left to expire
DRAIN_POLL = 0.05  # how often a leaving node looks whether its in-flight requests are done


class JoinError(VolunteerError):
    """The node cannot start: swarm unreachable, bad expert settings, missing device."""


@dataclass
class VolunteerOptions:
    """Everything a volunteer node is started with, besides the swarm it joins."""

    keypair: KeyPair | None = None  # default: a fresh identity
    listen: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"])
    host_config: HostConfig | None = None
    stack: StackOptions | None = None  # default: every standard service (NAT wing, perf...)
    # config.toml's [limits]: ResourceLimits fields and the expert server's request budget
    limits: dict = field(default_factory=dict)
    dht_config: DHTConfig | None = None  # default: DHTConfig(swarm_id=spec.id)
    nat: bool = True  # AutoNAT probes and relay reservations
    nat_servers: list[Multiaddr] | None = None  # default: the swarm's entry points
    mdns: bool = True  # find volunteers of the same swarm on the LAN
    # experts: built from (expert_class, uids, hidden_dim), or handed over ready-made in backends
    expert_class: str | None = None
    uids: list[str] = field(default_factory=list)
    hidden_dim: int = 64
    device: str = "auto"
    max_batch: int = 1024
    checkpoint_dir: Path | None = None
    max_gpu_memory: float | None = None  # fraction of the GPU's memory torch may take
    max_upload: float | None = None  # bytes per second of expert replies
    expert_file: str | None = None  # a Python file defining custom expert classes
    share_tracebacks: str = "redacted"  # what our expert errors show trainers: full, redacted, none
    experts_config: "ExpertsConfig | None" = None  # default: from device and max_batch
    backends: "Sequence[ExpertBackend] | None" = None
    leave_deadline: float = LEAVE_DEADLINE
    # replicated experts (the swarm file's [[grid]]): place=True picks uids by automatic placement
    place: bool = False
    max_experts: int | None = None  # placement capacity (default: what fits the GPU, else 8)
    replicas_config: "ReplicasConfig | None" = None  # default: replicas.DEFAULT_CONFIG

    @property
    def hosts_experts(self) -> bool:
        """Whether this node serves experts at all (a node without them still routes the DHT)."""
        return bool(self.uids) or bool(self.backends) or self.place


def _root_reason(exc: BaseException) -> str:
    """The innermost reason of a dial failure, without the addresses and peer ids each layer of
    DialError adds: ``Connection refused``, ``handshake timed out``."""
    from .errors import DialError

    while isinstance(exc, DialError) and exc.causes:
        exc = next(iter(exc.causes.values()))
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError) and cause.errno:
        return os.strerror(cause.errno)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.rsplit(": ", 1)[-1][:80]  # the innermost clause of "while …: because …: reason"


def _host_port(addr: Multiaddr) -> str:
    """``127.0.0.1:4001`` from a multiaddr (the whole address, less its /p2p part, otherwise)."""
    text = str(addr).split("/p2p/", 1)[0]
    parts = text.split("/")
    if len(parts) >= 5 and parts[1] in ("ip4", "ip6", "dns", "dns4", "dns6") and parts[3] in ("tcp", "udp"):
        return f"{parts[2]}:{parts[4]}"
    return text


def check_device(device: str, max_gpu_memory: float | None) -> str:
    """Resolve ``auto`` and refuse a CUDA device torch cannot see, with what to do instead."""
    import torch

    from .experts.backend import resolve_device

    resolved = resolve_device(device)
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = resolved.index or 0
        if index >= count:
            raise JoinError(f"no CUDA device {resolved} (torch sees {count} CUDA device(s)); use --device cpu or auto")
        if max_gpu_memory:
            torch.cuda.set_per_process_memory_fraction(max_gpu_memory, index)
    return str(resolved)


class VolunteerNode:
    """A running volunteer, as ``open_volunteer`` yields it: its parts, its state views (pieces of
    the CLI's status snapshot) and ``pause`` / ``resume`` / ``leave``."""

    def __init__(self, spec: SwarmSpec, options: VolunteerOptions, host: Host, device: str = "cpu") -> None:
        self.spec = spec
        self.options = options
        self.host = host
        self.dht: Any = None  # a DHTNode once the DHT runs
        self.nat: NatManager | None = None
        self.runtime: Runtime | None = None
        self.server: ExpertServer | None = None
        self.declarer: ExpertDeclarer | None = None
        self.hivemind: Any = None  # a hivemind.member.HivemindMember on a hivemind swarm
        self.replicas: ReplicaManager | None = None  # grid experts: placement, catch-up, sync, hand-off
        self.handed_off: HandOffResult | None = None  # what the graceful leave handed off
        self.device = device
        self.paused = False
        self._leave = trio.Event()
        self._rate_marks: dict[str, tuple[float, int]] = {}  # uid -> (when, requests) at the last view
        self._experts_since = 0.0

    # --- lifecycle -------------------------------------------------------------------------------
    def leave(self) -> None:
        """Ask the node to leave gracefully (Ctrl-C, SIGTERM, ``volunteer stop``); see ``wait_leave``."""
        self._leave.set()

    async def wait_leave(self) -> None:
        """Until ``leave()`` is called: the body of ``open_volunteer`` waits here, then exits."""
        await self._leave.wait()

    @property
    def leaving(self) -> bool:
        """Whether a graceful leave was asked for."""
        return self._leave.is_set()

    async def pause(self) -> None:
        """Stop taking expert requests and drop out of lookups at once; keep identity and connections."""
        self.paused = True
        if self.runtime is not None:
            self.runtime.pause()
        if self.declarer is not None:
            await self.declarer.pause()
        log.warning("paused: experts withdrawn from the DHT, new requests refused")

    def resume(self) -> None:
        """Take requests and declare the experts again."""
        self.paused = False
        if self.runtime is not None:
            self.runtime.resume()
        if self.declarer is not None:
            self.declarer.resume()
        log.warning("resumed: experts declared again")

    def in_flight(self) -> int:
        """Expert requests being served or queued right now."""
        busy = self.server.active_requests if self.server is not None else 0
        busy += self.hivemind.active_requests if self.hivemind is not None else 0
        queued = sum(s.queued for s in self.runtime.stats().values()) if self.runtime is not None else 0
        return busy + queued

    def loads(self) -> dict[str, float]:
        """Queue length per hosted expert, declared with each heartbeat so trainers spread out."""
        if self.runtime is None:
            return {}
        return {uid: float(s.queued) for uid, s in self.runtime.stats().items()}

    async def _leave_gracefully(self) -> None:
        # vanish from lookups, refuse new work, let running work finish (checkpoints come after)
        if self.declarer is not None:
            with trio.move_on_after(WITHDRAW_DEADLINE):
                await self.declarer.withdraw()
            self.declarer.uids = []  # nothing left to declare or withdraw when its task ends
        if self.runtime is not None:
            self.runtime.pause()
            with trio.move_on_after(self.options.leave_deadline):
                while self.in_flight():
                    await trio.sleep(DRAIN_POLL)
        if self.replicas is not None:
            # sole copies go to volunteers with room (bounded by handoff_timeout); the runtime's
            # exit saves every checkpoint afterwards, handed off or not
            self.handed_off = await self.replicas.hand_off_all()

    async def _reach_swarm(self, timeout: float = REACH_TIMEOUT) -> None:
        entry = self.spec.entry_points
        if not entry:
            return  # the first node of a new swarm: others will bootstrap from us
        host = self.host
        failures: dict[Multiaddr, str] = {}
        reached = False

        async def one(addr: Multiaddr) -> None:
            nonlocal reached
            try:
                with trio.fail_after(timeout):
                    await host.connect(addr)
                reached = True
            except trio.TooSlowError:
                failures[addr] = f"no answer within {timeout:g} s"
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                failures[addr] = _root_reason(exc)

        async with trio.open_nursery() as nursery:
            for addr in entry:
                nursery.start_soon(one, addr)
        if not reached:
            # one short line: where (host:port, no peer id), why (the innermost reason), what next
            addr, reason = next(iter(failures.items()))
            where = _host_port(addr)
            doctor = str(self.spec.path) if self.spec.path is not None else str(addr)
            kind = "relay" if addr in self.spec.relays else "bootstrap peer"
            whom = f"its {kind} {where}" if len(entry) == 1 else f"none of its {len(entry)} bootstrap peers/relays ({where}: "
            raise JoinError(
                f"cannot reach swarm {self.spec.name!r}: "
                + (f"{whom} did not answer ({reason})" if len(entry) == 1 else f"{whom}{reason}) answered")
                + f"; run `volunteer doctor {doctor}` to see why"
            )

    def _apply_reachability(self, reachability: Reachability) -> None:
        # private volunteers run the DHT in client mode: routing others to them would fail
        private = reachability is Reachability.PRIVATE
        if self.dht.client_mode != private:
            log.info("DHT %s mode (reachability: %s)", "client" if private else "server", reachability.value)
            self.dht.set_client_mode(private)

    async def _follow_reachability(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # subscribe before reading the current verdict, so no change falls between the two
        with self.host.events.subscribe(ReachabilityChanged) as changes:
            if self.nat is not None:
                self._apply_reachability(self.nat.reachability)
            task_status.started()
            async for change in changes:
                if isinstance(change, ReachabilityChanged) and isinstance(change.reachability, Reachability):
                    self._apply_reachability(change.reachability)

    async def _discover_lan(self, nursery: trio.Nursery) -> None:
        # peers found by mDNS are pinged by the DHT: those of our swarm join the routing table
        from .dht.mdns import MdnsDiscovery

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

    @asynccontextmanager
    async def _serve_experts(self, nursery: trio.Nursery) -> AsyncIterator[None]:
        opts = self.options
        if not opts.hosts_experts:
            yield
            return
        from .experts import ExpertsConfig, load_expert_file, make_backend, open_runtime
        from .experts.server import ExpertServer

        if opts.expert_file:
            load_expert_file(opts.expert_file)
        expert_limits = {k: v for k, v in opts.limits.items() if k in EXPERT_LIMITS}
        config = opts.experts_config or ExpertsConfig(
            device=self.device, max_batch_size=opts.max_batch, share_tracebacks=opts.share_tracebacks, **expert_limits
        )
        expert_class = opts.expert_class
        if opts.place and not self.spec.grids:
            raise JoinError(f"swarm {self.spec.name!r} declares no [[grid]]: pass --experts CLASS:PATTERN")
        if opts.backends is None and expert_class is None and not self.spec.grids:  # grids name their class
            raise JoinError("cannot build experts: no expert class given (e.g. --experts ffn:expert.[0:4])")

        def build(uid: str, cls: str, hidden: int) -> ExpertBackend:
            return make_backend(uid, cls, hidden, config=config, checkpoint_dir=opts.checkpoint_dir)

        try:
            if opts.backends is not None:
                backends = list(opts.backends)
            elif self.spec.grids and self.spec.kind == "hivemind" and not opts.uids:
                # hivemind has no replica protocols: host the declared grid, up to our capacity
                every = [(uid, grid) for grid in self.spec.grids for uid in grid.uids()]
                cap = opts.max_experts if opts.max_experts is not None else len(every)
                backends = [build(uid, grid.expert_class, grid.hidden_dim) for uid, grid in every[:cap]]
            elif self.spec.grids and self.spec.kind != "hivemind":
                backends = await self._replicated_backends(build)
            else:
                backends = [build(uid, expert_class or "", opts.hidden_dim) for uid in opts.uids]
        except (ExpertConfigError, KeyError, ValueError) as exc:
            raise JoinError(f"cannot build experts: {describe(exc)}") from None
        async with open_runtime(backends, config) as runtime:
            self.runtime = runtime
            self._experts_since = trio.current_time()
            if self.hivemind is not None:  # hivemind's RPCs and declarations instead of ours
                await self.hivemind.serve(runtime, config)
                yield
                return
            self.server = ExpertServer(self.host, runtime, self.spec.id, config)
            if opts.max_upload:
                self.server.upload_limit = opts.max_upload
            self.server.install()
            manager = self.replicas
            if manager is not None:
                manager.store.backends = runtime.backends  # the runtime's dict from now on
                manager.store.runtime = runtime
                for service in manager.services():  # before declaring: replicas sync with us at once
                    await self.host.add_service(service)
            from .replicas.manager import versions_of

            synced = {"synced_ages": manager.synced_age} if manager is not None else {}
            self.declarer = ExpertDeclarer(
                self.dht, runtime.uids, loads=self.loads, versions=versions_of(runtime.backends), **synced
            )
            await nursery.start(self.declarer.run)
            if manager is not None:
                manager.declarer = self.declarer
                await nursery.start(manager.run)
            yield
        # leaving the runtime's block saved every checkpoint

    @asynccontextmanager
    async def _join_hivemind(self) -> AsyncIterator[None]:
        from .hivemind import HivemindError
        from .hivemind.member import join_member

        try:
            self.hivemind = await join_member(self.host, self.spec.bootstrap)
        except HivemindError as exc:
            raise JoinError(f"cannot join hivemind swarm {self.spec.name!r}: {describe(exc)}") from None
        async with trio.open_nursery() as nursery, self._serve_experts(nursery):
            yield

    async def _replicated_backends(self, build: Any) -> list[ExpertBackend]:
        """The backends to start with when the swarm declares grids: placement's choice (or the
        given uids), each caught up from its freshest live replica before it is ever declared."""
        from .experts.backend import resolve_device
        from .replicas import DEFAULT_CONFIG, BackendStore, grid_of
        from .replicas.manager import SURVEY_TIMEOUT, ReplicaManager, placement_capacity

        opts = self.options
        rconfig = opts.replicas_config or DEFAULT_CONFIG
        grids = self.spec.grids
        if opts.place:
            cap = placement_capacity(grids, resolve_device(self.device), max_experts=opts.max_experts,
                                     max_gpu_memory=opts.max_gpu_memory, config=rconfig)
        else:
            cap = opts.max_experts if opts.max_experts is not None else len(opts.uids)

        def factory(header: Any) -> ExpertBackend:  # a handed-off expert: only grid experts are taken
            if grid_of(header.uid, grids) is None:
                raise ExpertConfigError(f"{header.uid!r} is in no grid of this swarm")
            return build(header.uid, header.expert_class, header.hidden_dim)

        manager = ReplicaManager(host=self.host, dht=self.dht, swarm_id=self.spec.id, grids=grids, build=build,
                                 store=BackendStore({}, capacity=cap, factory=factory, config=rconfig),
                                 capacity=cap, auto_place=opts.place, config=rconfig)
        manager.store.on_accepted = manager.accepted
        manager.store.make_room = manager.make_room
        self.replicas = manager
        hosts: dict = {}
        with trio.move_on_after(SURVEY_TIMEOUT):
            try:
                hosts = await manager.survey(opts.uids)
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.warning("cannot survey the grid (placing on an empty view): %s", describe(exc))
        if opts.place:
            uids = list(manager.placement(hosts).host)
            log.info("placement: hosting %d of the swarm's grid experts (capacity %d)", len(uids), cap)
        else:
            uids = list(opts.uids)
            outside = [uid for uid in uids if grid_of(uid, grids) is None]
            if outside:
                log.warning("hosting %d expert(s) outside every grid the swarm declares: %s", len(outside),
                            ", ".join(outside[:4]))
        backends: list[ExpertBackend] = []
        limiter = trio.CapacityLimiter(2)  # catch-ups at once: sources serve only a few transfers each

        async def one(uid: str) -> None:
            grid = grid_of(uid, grids)
            if grid is not None and (opts.place or opts.expert_class is None):
                backend = build(uid, grid.expert_class, grid.hidden_dim)
            else:
                backend = build(uid, opts.expert_class or "", opts.hidden_dim)
            async with limiter:
                ok = grid is None or await manager.prepare(backend, hosts)
            if ok or not opts.place:  # uids the user named are hosted anyway (warned in prepare)
                backends.append(backend)

        async with trio.open_nursery() as catchups:
            for uid in uids:
                catchups.start_soon(one, uid)
        return sorted(backends, key=lambda b: b.uid)

    # --- state views: pieces of the status snapshot, JSON-serialisable ---------------------------
    def reachability_view(self) -> dict | None:
        """AutoNAT's verdict, the NAT mapping, observed addresses and relay reservations."""
        if self.nat is None:
            return None
        nat = self.nat.snapshot()
        return {
            "status": nat["reachability"],
            "nat_type": nat["mapping"],
            "observed_addrs": nat["observed_addrs"],
            # punch attempts by transport and result, time to direct (the HolePuncher's snapshot)
            "hole_punching": nat["hole_punching"],
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

    def connections_view(self) -> list[dict]:
        """One row per open connection: peer, path (direct quic, direct tcp, relayed), whether it was
        hole-punched, RTT, bytes."""
        host = self.host
        rows = []
        for conn in host.connections():
            if conn.is_closed:
                continue
            relay = conn.remote_addr.relay_parts() if conn.remote_addr.is_relayed() else None
            rows.append(
                {
                    "peer_id": str(conn.remote_peer),
                    "path": conn.path_label,  # direct quic, direct tcp, relayed
                    "hole_punched": conn.path.value == "hole-punched",
                    "transport": conn.transport,
                    "via": str(relay[1]) if relay and relay[1] else None,
                    "rtt_ms": round(conn.rtt * 1000, 2) if conn.rtt else None,
                    "bytes_in": conn.bytes_received,
                    "bytes_out": conn.bytes_sent,
                    "addr": str(conn.remote_addr),
                    "agent": getattr(host.peerstore.get(conn.remote_peer), "agent_version", None),
                }
            )
        return rows

    def dht_view(self) -> dict | None:
        """The DHT's figures plus how fresh our declarations are."""
        if self.hivemind is not None:
            return self.hivemind.snapshot()
        if self.dht is None:
            return None
        view = self.dht.snapshot()
        last = self.declarer.last_declared if self.declarer else None
        view["last_declared_age_s"] = round(self.dht.clock() - last, 1) if last else None
        view["experts_declared"] = len(self.declarer.uids) if self.declarer and not self.paused else 0
        return view

    def expert_rows(self, now: float) -> list[dict]:
        """One row per hosted expert; ``requests_per_s`` is over the time since the previous call
        (``now`` on trio's clock)."""
        if self.runtime is None:
            return []
        rows = []
        synced = self.replicas.sync.last_sync if self.replicas is not None else {}
        for uid, s in sorted(self.runtime.stats().items()):
            then, count = self._rate_marks.get(uid, (self._experts_since, 0))
            rate = (s.requests - count) / (now - then) if now > then else 0.0
            self._rate_marks[uid] = (now, s.requests)
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
                    "version": s.updates,
                    "last_sync_age_s": round(now - synced[uid], 1) if uid in synced else None,
                }
            )
        return rows

    def coverage_view(self) -> dict | None:
        """The swarm's coverage of its declared grids (as this volunteer last surveyed it) and
        warnings (experts with no host, experts hosted outside every grid); None without grids."""
        if self.replicas is None:
            return None
        return self.replicas.coverage()

    def compute_view(self) -> dict:
        """The device the experts run on and, for CUDA, its memory and utilisation."""
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

    def __repr__(self) -> str:
        return f"<VolunteerNode {self.spec.name!r} as {self.host.peer_id.short()}>"


@asynccontextmanager
async def open_volunteer(spec: SwarmSpec, options: VolunteerOptions | None = None) -> AsyncIterator[VolunteerNode]:
    """Run a volunteer node of swarm ``spec`` for the block's lifetime (see the module docstring).

    Raises JoinError when the swarm cannot be reached or the experts cannot be built."""
    opts = options or VolunteerOptions()
    device = "cpu"
    if opts.experts_config is not None:
        device = str(opts.experts_config.device)
    elif opts.hosts_experts:
        device = check_device(opts.device, opts.max_gpu_memory)
    dht_config = opts.dht_config or DHTConfig(swarm_id=spec.id)
    keypair = opts.keypair or KeyPair.generate()
    resource_limits = {k: v for k, v in opts.limits.items() if k not in EXPERT_LIMITS}
    services = [ResourceManager(ResourceLimits(**resource_limits))] if resource_limits else []
    async with open_stack(keypair, opts.listen, options=opts.stack, config=opts.host_config, services=services) as host:
        node = VolunteerNode(spec, opts, host, device)
        await node._reach_swarm()
        if spec.kind == "hivemind":  # a hivemind 1.1 swarm: its DHT and expert RPCs, not ours
            async with node._join_hivemind():
                yield node
                await node._leave_gracefully()
            return
        async with trio.open_nursery() as nursery, open_dht(
            host, dht_config, bootstrap=spec.entry_points, client_mode=False
        ) as dht:
            node.dht = dht
            if opts.nat:
                servers = opts.nat_servers if opts.nat_servers is not None else spec.entry_points
                node.nat = NatManager(host, servers, spec.relays)
                await host.add_service(node.nat)
            await nursery.start(node._follow_reachability)
            if opts.mdns:
                nursery.start_soon(node._discover_lan, nursery)
            async with node._serve_experts(nursery):
                yield node
                await node._leave_gracefully()
            nursery.cancel_scope.cancel()


__all__ = ["JoinError", "VolunteerNode", "VolunteerOptions", "check_device", "open_volunteer"]
