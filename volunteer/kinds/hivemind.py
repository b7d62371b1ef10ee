"""The hivemind swarm kind (``kind = "hivemind"``): a hivemind 1.1 swarm, spoken through
``volunteer.hivemind``'s personality. Nothing of our own protocols runs on such a node.

A volunteer's services, in start order:

    HivemindDHT        hivemind's DHT (server mode)
    HivemindRefusals   averaging RPCs answered with "not supported by volunteer"
    KadPeerRouting     /ipfs/kad/1.0.0: p2pd peers find us by peer id
    HivemindMember     joins through the swarm's initial peers before it reports started
    HivemindExperts    ConnectionHandler.rpc_* over our runtime, declared every 30 s   (hosting experts)

A trainer joins hivemind's DHT in client mode and calls experts through ``HivemindDirectory``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from ..errors import JoinError, VolunteerError, describe
from ..net.stack import open_stack
from ..net.identity import KeyPair
from ..net.multiaddr import Multiaddr
from ..net.service import HostAPI, Service
from ..swarmfile import SwarmSpec
from .base import BuildBackend, Check, DoctorPlan, ExpertListing, NodeContext, NodeParts, TrainerParts
from .hosting import RuntimeHosting
from .options import VolunteerOptions

if TYPE_CHECKING:
    from ..dht import DHTConfig
    from ..experts.backend import ExpertBackend

LOOKUP_TIMEOUT = 60.0  # ``volunteer experts``: the grid walk gives up after this long (what it found is shown)
CHECK_TIMEOUT = 15.0  # ``volunteer doctor``: one initial peer's hivemind checks
COLUMNS = ("uid", "host", "reached", "load", "heartbeat", "expires")


class HivemindKind:
    """A hivemind 1.1 swarm: its DHT, kad, refusals and expert RPCs instead of ours."""

    name = "hivemind"

    # --- a volunteer ------------------------------------------------------------------------------
    def starting_backends(self, spec: SwarmSpec, options: VolunteerOptions, build: BuildBackend) -> list["ExpertBackend"]:
        if spec.grids and not options.uids:
            # hivemind has no replica protocols: host the declared grid, up to our capacity
            every = [(uid, grid) for grid in spec.grids for uid in grid.uids()]
            cap = options.max_experts if options.max_experts is not None else len(every)
            return [build(uid, grid.expert_class, grid.hidden_dim) for uid, grid in every[:cap]]
        return [build(uid, options.expert_class or "", options.hidden_dim) for uid in options.uids]

    def node_parts(self, node: NodeContext) -> NodeParts:
        from ..hivemind import HivemindDHT
        from ..hivemind.kad import KadPeerRouting
        from ..hivemind.member import HivemindMember
        from ..hivemind.unsupported import HivemindRefusals

        dht = HivemindDHT()
        experts = None
        if node.runtime is not None:
            from ..experts import DEFAULT_CONFIG
            from ..hivemind.experts import HivemindExperts

            experts = HivemindExperts(node.runtime, dht=dht, config=node.experts_config or DEFAULT_CONFIG)
        member = HivemindMember(dht, node.spec.bootstrap, experts=experts, swarm_name=node.spec.name)
        services: list[Service] = [dht, HivemindRefusals(), KadPeerRouting(), member]
        if experts is not None:
            services.append(experts)
        # hivemind's service declares the runtime's experts each round: the runtime is the hosting
        hosting = RuntimeHosting(node.runtime) if node.runtime is not None else None
        return NodeParts(services, dht_status=member.snapshot, server=experts, hosting=hosting)

    # --- a trainer --------------------------------------------------------------------------------
    async def join_trainer(
        self, host: HostAPI, spec: SwarmSpec, *, dht_config: "DHTConfig | None" = None, credential: bytes | None = None
    ) -> TrainerParts:
        from ..hivemind.trainer import HivemindDirectory, join_as_trainer

        dht = await join_as_trainer(host, spec.bootstrap, swarm_name=spec.name)
        return TrainerParts(HivemindDirectory(host, dht), dht)

    # --- the CLI ----------------------------------------------------------------------------------
    async def list_experts(self, spec: SwarmSpec, prefixes: Sequence[str]) -> ExpertListing:
        from ..hivemind import HivemindDHT
        from ..hivemind.kad import KadPeerRouting
        from ..hivemind.listing import walk_hivemind_grid

        if not spec.bootstrap:
            raise JoinError(f"hivemind swarm {spec.name!r} lists no initial peers (bootstrap)")
        dht = HivemindDHT(client_mode=True)
        rows: list[dict] = []
        incomplete = None
        async with open_stack(KeyPair.generate(), services=[dht, KadPeerRouting()]):
            if not await dht.bootstrap(list(spec.bootstrap)):
                raise JoinError(f"cannot reach hivemind swarm {spec.name!r}: no initial peer answered a hivemind DHT ping")
            for prefix in prefixes:
                listing = await walk_hivemind_grid(dht, prefix, timeout=LOOKUP_TIMEOUT)
                rows += listing.rows
                incomplete = incomplete or listing.cut
        return ExpertListing(rows, f"hivemind swarm {spec.name!r}", COLUMNS, incomplete=incomplete)

    def doctor_plan(self, spec: SwarmSpec) -> DoctorPlan:
        if not spec.bootstrap:
            raise VolunteerError(f"hivemind swarm {spec.name!r} lists no initial peers to check")
        return DoctorPlan(list(spec.bootstrap), perf=False)  # p2pd does not serve perf

    async def check_peers(self, peers: Sequence[Multiaddr]) -> list[Check]:
        """Whether each initial peer answers hivemind's DHT ping and a kad PING."""
        from ..hivemind import HivemindDHT
        from ..hivemind.kad import KadPeerRouting

        checks: list[Check] = []
        dht, kad = HivemindDHT(client_mode=True), KadPeerRouting()
        async with open_stack(KeyPair.generate(), services=[dht, kad]) as host:
            for addr in peers:
                name = f"hivemind {addr.peer_id.short() if addr.peer_id else addr}"[:22]
                try:
                    with trio.fail_after(CHECK_TIMEOUT):
                        conn = await host.connect(addr)
                        node_id = await dht.ping(conn.remote_peer)
                        kad_ok = await kad.ping(conn.remote_peer)
                except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                    checks.append(Check("FAIL", name, describe(exc), "check the address of this initial peer"))
                    continue
                if node_id is None:
                    checks.append(Check("FAIL", name, "no answer to hivemind's DHT ping",
                                        "is it a hivemind 1.1 peer? initial peers must not run in client mode"))
                else:
                    kad_text = "kad peer routing answers" if kad_ok else "no kad peer routing (peers named by id only are unreachable through it)"
                    checks.append(Check("OK" if kad_ok else "WARN", name, f"DHT node {node_id:040x}"[:32] + f"…; {kad_text}",
                                        "run its p2pd with the DHT in server mode"))
        return checks


__all__ = ["HivemindKind"]
