"""Our own swarm kind (``kind = "volunteer"``): what a volunteer of such a swarm runs, how a
trainer joins it, and what ``volunteer experts`` and ``volunteer doctor`` ask of it.

A volunteer's services, in start order (each starts once the one before it is ready):

    NatManager       AutoNAT probes and relay reservations, at once            (options.nat)
                     (reachable first: beside the DHT's bootstrap, not after it; iroh dials
                     its home relay in parallel with everything else)
    DHTNode          joins through the entry points; client mode follows the NAT manager's verdict
    LanDiscovery     mDNS: volunteers on the LAN join the DHT                  (options.mdns)
    ExpertServer     /volunteer/<swarm>/experts/1.0.0 over the runtime          (hosting experts)
    VerdictWatch     the swarm's proofs, checked by recompute (experts/verdicts.py) (receipts and grids)
    StateService, ReplicaSync, ReplicaManager                                  (the swarm has grids)
                     the manager chooses and catches up what to host before it reports started
    ExpertDeclarer   heartbeats, last: nothing is declared before it can be served

To add a protocol to every volunteer, write a Host service (``volunteer.net.service``) and add
it to this list; ``open_volunteer`` starts it with the rest. Services of one node only (a test,
a plug-in) go in ``VolunteerOptions.services`` instead.
"""

from __future__ import annotations

from dataclasses import replace

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from ..dht import DHTConfig
from ..dht.declare import ExpertDeclarer
from ..dht.grid import list_experts as list_grid
from ..dht.lan import LanDiscovery
from ..dht.node import DHTNode, open_dht
from ..dht.profile import Profile
from ..dht.status import DHTPanel
from ..errors import ExpertConfigError, JoinError, VolunteerError
from ..net.stack import open_stack
from ..net.identity import KeyPair
from ..net.multiaddr import Multiaddr
from ..net.nat.manager import NatManager
from ..net.service import HostAPI, Service
from ..net.upload import UploadMeter
from ..swarmfile import GridSpec, SwarmSpec
from .base import BuildBackend, Check, DoctorPlan, ExpertListing, NodeContext, NodeParts, TrainerParts
from .hosting import RuntimeHosting
from .options import VolunteerOptions

if TYPE_CHECKING:
    from ..experts.backend import ExpertBackend
    from ..experts.runtime import Runtime
    from ..experts.verdicts import VerdictWatch
    from ..replicas.coverage import Coverage
    from ..replicas.messages import StateHeader

LOOKUP_TIMEOUT = 30.0  # ``volunteer experts``: the grid walk gives up after this long
COLUMNS = ("uid", "host", "reached", "load", "version", "claim", "heartbeat")
FIRST_VERDICT_READ = 10.0  # seconds a starting volunteer gives the swarm's proofs before its catch-up


class VolunteerKind:
    """Our swarm kind: our DHT, declarations, expert protocol and replicas."""

    name = "volunteer"

    # --- a volunteer ------------------------------------------------------------------------------
    def starting_backends(self, spec: SwarmSpec, options: VolunteerOptions, build: BuildBackend) -> list["ExpertBackend"]:
        if spec.grids:
            return []  # the replica manager chooses them and catches them up before they are served
        return [build(uid, options.expert_class or "", options.hidden_dim) for uid in options.uids]

    def node_parts(self, node: NodeContext) -> NodeParts:
        host, spec, options = node.host, node.spec, node.options
        services: list[Service] = []
        nat = None
        if options.nat:
            # first: its probes and reservations start now and run beside the DHT's bootstrap
            servers = options.nat_servers if options.nat_servers is not None else spec.entry_points
            nat = NatManager(host, servers, spec.relays)
            services.append(nat)
        dht = DHTNode(host, options.dht_config or DHTConfig(swarm_id=spec.id), bootstrap=spec.entry_points,
                      follow_reachability=True, reachability=(lambda: nat.reachability) if nat is not None else None)
        services.append(dht)
        if options.mdns:
            services.append(LanDiscovery(dht))
        if node.runtime is None:
            return NodeParts(services, dht_status=lambda: dht_status(dht, None), dht=dht)
        return self._hosting(node, node.runtime, dht, services, nat)

    def _hosting(self, node: NodeContext, runtime: "Runtime", dht: DHTNode, services: list[Service],
                 nat: NatManager | None = None) -> NodeParts:
        from ..experts import DEFAULT_CONFIG
        from ..experts.server import ExpertServer
        from ..experts.trainers import TrainerPolicy
        from ..replicas.providers import versions_of

        host, spec, options = node.host, node.spec, node.options
        # one meter for everything this volunteer uploads: replies, sync, catch-up served, hand-off
        upload = UploadMeter(options.max_upload)
        server = ExpertServer(host, runtime, spec.id, node.experts_config or DEFAULT_CONFIG,
                              upload=upload, on_served=options.on_served,
                              on_outcome=options.on_outcome,
                              trainers=TrainerPolicy.from_settings(spec.trainers, spec.organiser, spec.forwards))
        services.append(server)

        def loads() -> dict[str, float]:  # queue length per expert: trainers spread out by it
            return {uid: float(s.queued) for uid, s in runtime.stats().items()}

        def profile() -> Profile:  # what the swarm's public health pages show of us (no address)
            stats = runtime.stats().values()
            addrs = host.shareable_addrs()
            # how much of our peer traffic went direct (the NAT manager's counts): the page pools them
            direct = nat.direct_view() if nat is not None else None
            return Profile(name=options.public_name, calls=sum(s.requests for s in stats),
                           samples=sum(s.samples for s in stats), bytes_sent=server.bytes_out, experts=len(runtime.uids),
                           relayed=bool(addrs) and all(a.is_relayed() for a in addrs),
                           peer_sessions=direct["peer_sessions"] if direct else 0,
                           peer_sessions_direct=direct["peer_sessions_direct"] if direct else 0,
                           bytes_direct=direct["bytes_direct"] if direct else 0,
                           bytes_relayed=direct["bytes_relayed"] if direct else 0)

        versions = versions_of(runtime.backends)
        if not spec.grids or options.backends is not None:
            declarer = ExpertDeclarer(dht, runtime.uids, loads=loads, versions=versions, profile=profile)
            services.append(declarer)
            return NodeParts(services, dht_status=lambda: dht_status(dht, declarer), server=server,
                             declarer=declarer, dht=dht, hosting=RuntimeHosting(runtime, declarer))

        from ..replicas import DEFAULT_CONFIG as REPLICAS, BackendStore, ReplicaSync, grid_of
        from ..replicas.exclusions import NO_EXCLUSIONS
        from ..replicas.manager import ReplicaManager, StartHosting
        from ..replicas.providers import placement_capacity, synced_ages

        config = options.replicas_config or REPLICAS
        grids, build = spec.grids, node.build
        if options.place:
            from ..experts.backend import resolve_device

            capacity = placement_capacity(grids, resolve_device(node.device), max_experts=options.max_experts,
                                          max_gpu_memory=options.max_gpu_memory, max_ram=options.max_ram, config=config)
        else:
            capacity = options.max_experts if options.max_experts is not None else len(options.uids)

        def factory(header: "StateHeader") -> "ExpertBackend":  # a handed-off expert: grid experts only
            if grid_of(header.uid, grids) is None or build is None:
                raise ExpertConfigError(f"{header.uid!r} is in no grid of this swarm")
            if header.hidden_dim is None:
                raise ExpertConfigError(f"the state of {header.uid!r} names no width to build it with")
            return build(header.uid, header.expert_class, header.hidden_dim)

        store = BackendStore(runtime.backends, runtime=runtime, capacity=capacity, factory=factory, config=config)
        managers: list[ReplicaManager] = []
        watch = _verdict_watch(host, dht, spec.id, managers) if spec.receipts else None
        exclusions = watch.book if watch is not None else NO_EXCLUSIONS
        if watch is not None:
            services.append(watch)  # before the replicas: a joiner checks the proofs it finds before any catch-up
        sync = ReplicaSync(spec.id, store, config, upload=upload, exclusions=exclusions)
        declarer = ExpertDeclarer(dht, runtime.uids, loads=loads, versions=versions, synced_ages=synced_ages(sync),
                                  profile=profile)
        replicas = ReplicaManager(
            host=host, dht=dht, store=store, sync=sync, declarer=declarer, swarm_id=spec.id, grids=grids,
            build=build, capacity=capacity, auto_place=options.place, config=config,
            start=StartHosting(tuple(options.uids), options.expert_class, options.hidden_dim), upload=upload,
            exclusions=exclusions,
        )
        managers.append(replicas)
        services += [replicas.state, sync, replicas, declarer]
        return NodeParts(services, dht_status=lambda: dht_status(dht, declarer), server=server, declarer=declarer,
                         replicas=replicas, dht=dht, hosting=replicas)

    # --- a trainer --------------------------------------------------------------------------------
    async def join_trainer(
        self, host: HostAPI, spec: SwarmSpec, *, dht_config: DHTConfig | None = None, credential: bytes | None = None
    ) -> TrainerParts:
        from ..experts.client import DHTDirectory

        dht = DHTNode(host, dht_config or DHTConfig.for_trainer(spec.id), client_mode=True, bootstrap=spec.entry_points)
        await host.add_service(dht)
        if spec.entry_points and len(dht.state.table) == 0:
            raise VolunteerError(f"cannot reach swarm {spec.name!r}: no bootstrap peer or relay answered")
        from ..experts import DEFAULT_CONFIG

        # a swarm of exact audits: every reply must carry a receipt (else the call failed)
        config = replace(DEFAULT_CONFIG, receipts=spec.receipts)
        return TrainerParts(DHTDirectory(host, dht, spec.id, config, credential=credential), dht)

    # --- the CLI ----------------------------------------------------------------------------------
    async def list_experts(self, spec: SwarmSpec, prefixes: Sequence[str]) -> ExpertListing:
        if not spec.entry_points:
            raise JoinError(f"swarm {spec.name!r} lists no bootstrap peers or relays")
        async with open_stack(KeyPair.generate()) as host:
            async with open_dht(host, DHTConfig.for_trainer(spec.id), bootstrap=spec.entry_points, client_mode=True) as dht:
                if len(dht.state.table) == 0:
                    raise JoinError(f"cannot reach swarm {spec.name!r}: no bootstrap peer answered")
                found = {}
                with trio.fail_after(LOOKUP_TIMEOUT):
                    for prefix in prefixes:
                        found.update(await list_grid(dht, prefix))
        now = time.time()
        rows = []
        for uid, hosts in found.items():
            for decl in hosts:
                addrs = [Multiaddr(a) for a in decl.addrs]
                direct = [a for a in addrs if not a.is_relayed()]
                rows.append({
                    "uid": uid,
                    "peer_id": str(decl.peer),
                    "reached": "direct" if direct else ("relayed" if addrs else "unknown"),
                    "addrs": [str(a) for a in addrs],
                    "load": decl.load,
                    "heartbeat_age_s": round(now - decl.heartbeat, 1),
                    "expires_in_s": round(decl.expiration - now, 1),
                    "version": int(decl.version or 0),
                    # the age declared at the heartbeat, plus the heartbeat's own age
                    "last_sync_age_s": None if decl.synced_age is None else round(decl.synced_age + max(0.0, now - decl.heartbeat), 1),
                })
        mark_claims(rows)
        coverage = coverage_of(spec.grids, rows) if spec.grids else None
        return ExpertListing(rows, f"swarm {spec.name!r}", COLUMNS, coverage=coverage)

    def doctor_plan(self, spec: SwarmSpec) -> DoctorPlan:
        if not spec.entry_points:
            raise VolunteerError(f"swarm {spec.name!r} lists no bootstrap peers or relays to check")
        return DoctorPlan(spec.entry_points, perf=True)

    async def check_peers(self, peers: Sequence[Multiaddr]) -> list[Check]:
        return []  # the netcheck says all there is: reach, AutoNAT, NAT type, relays, perf


def _verdict_watch(host: HostAPI, dht: DHTNode, swarm_id: str, managers: list) -> "VerdictWatch":
    """A volunteer's watcher of shared verdicts (swarms with receipts: only they have proofs):
    reads the index and the keys of the replicas its manager surveyed, checks new proofs by
    recompute; its book is what the replicas ask (``replicas.exclusions.Exclusions``)."""
    from functools import partial

    from ..experts.client import call_expert
    from ..experts.verdicts import VerdictWatch, snapshot_fetcher

    def peers() -> list[str]:
        return [peer for manager in managers for holders in manager.hosts.values() for peer in holders]

    return VerdictWatch(dht, host.keypair, swarm_id, snapshot_fetcher(partial(call_expert, host, swarm_id=swarm_id)),
                        peers=peers, first_read=FIRST_VERDICT_READ)


def dht_status(dht: DHTNode, declarer: ExpertDeclarer | None) -> DHTPanel:
    """The DHT panel of ``volunteer status``: the node's figures, and how fresh and how many our
    declarations are (none declared while paused)."""
    declared = declarer.snapshot() if declarer is not None else None
    last = declared["last_declared"] if declared is not None else None
    return {
        **dht.snapshot(),
        "last_declared_age_s": round(dht.clock() - last, 1) if last else None,
        "experts_declared": declared["experts_declared"] if declared is not None else 0,
    }


def coverage_of(grids: Sequence[GridSpec], rows: list[dict]) -> Coverage:
    """The swarm's coverage of its declared grids, from the flat rows (one per expert and host)."""
    from ..replicas.coverage import coverage

    hosts: dict[str, dict[str, int]] = {}
    for row in rows:
        hosts.setdefault(row["uid"], {})[row["peer_id"]] = row["version"]
    return coverage(grids, hosts)


def mark_claims(rows: list[dict]) -> None:
    """Give every row its replica's ``claim`` standing among the other replicas of its uid
    (``claim_standings``: ``suspect``, ``sole`` or ``plausible``), in place."""
    from ..replicas.config import DEFAULT_CONFIG
    from ..replicas.coverage import claim_standings

    hosts: dict[str, dict[str, int]] = {}
    for row in rows:
        hosts.setdefault(row["uid"], {})[row["peer_id"]] = row["version"]
    standings = claim_standings(
        hosts, factor=DEFAULT_CONFIG.version_claim_factor, margin=DEFAULT_CONFIG.version_claim_margin
    )
    for row in rows:
        row["claim"] = standings[row["uid"]][row["peer_id"]]


__all__ = ["VolunteerKind", "coverage_of", "dht_status", "mark_claims"]
