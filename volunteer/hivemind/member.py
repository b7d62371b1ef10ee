"""A volunteer node's membership of a hivemind swarm: what ``open_volunteer`` runs instead of our
DHT and declarer when the swarm file says ``kind = "hivemind"``.

    member = await join_member(host, spec.bootstrap)   # HivemindDHT, joined through them
    await member.serve(runtime, config)                # + HivemindExperts, declaring every 30 s

Our swarm id never goes on hivemind's wire (hivemind has no such thing). What we do not speak of
hivemind (averaging, signed-record validators, authorizers) is refused where it is asked for:
the swarm file (``swarmfile.HIVEMIND_UNSUPPORTED``), the DHT's ``auth`` fields, and on the wire
(``unsupported.HivemindRefusals`` answers averaging RPCs with an error saying so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..net.multiaddr import Multiaddr
from ..net.service import HostAPI
from .dht import HivemindDHT
from .errors import HivemindError
from .kad import KadPeerRouting
from .unsupported import HivemindRefusals

if TYPE_CHECKING:
    from .experts import HivemindExperts


class HivemindMember:
    """Our node in a hivemind swarm: its DHT service and, once experts run, its expert service."""

    def __init__(self, host: HostAPI, dht: HivemindDHT, refusals: HivemindRefusals | None = None) -> None:
        self.host = host
        self.dht = dht
        self.refusals = refusals
        self.experts: HivemindExperts | None = None

    async def serve(self, runtime: Any, config: Any) -> "HivemindExperts":
        """Serve ``runtime``'s experts on hivemind's RPCs and declare them every 30 s."""
        from .experts import HivemindExperts

        self.experts = HivemindExperts(runtime, dht=self.dht, config=config)
        await self.host.add_service(self.experts)
        return self.experts

    @property
    def active_requests(self) -> int:
        """hivemind calls being served now (the runtime's queue counts the rest)."""
        return self.experts.active if self.experts is not None else 0

    def snapshot(self) -> dict:
        """The DHT figures of ``volunteer status`` (our DHT's keys; what hivemind's DHT does not
        count is None, shown "–")."""
        experts = self.experts
        last = experts.last_declared if experts is not None else None
        core = self.dht.core
        return {
            "kind": "hivemind",
            "node_id": f"{self.dht.node_id:040x}",
            "routing_table": len(core.contacts),
            "records": len(core.storage),
            "client_mode": core.client_mode,
            "requests": None,
            "failures": None,
            "bytes_in": None,
            "bytes_out": None,
            "rejected": {},
            "last_declared_age_s": round(self.dht.clock() - last, 1) if last else None,
            "experts_declared": len(experts.declared) if experts is not None else 0,
        }


async def join_member(host: HostAPI, bootstrap: Sequence[Multiaddr]) -> HivemindMember:
    """Join the hivemind DHT through ``bootstrap`` (its initial peers; none: we are the first).
    Raises HivemindError when initial peers were given and none answers a hivemind ping."""
    dht = HivemindDHT()
    await host.add_service(dht)
    refusals = HivemindRefusals()
    await host.add_service(refusals)
    if host.service(KadPeerRouting) is None:
        await host.add_service(KadPeerRouting())
    if bootstrap and not await dht.bootstrap(list(bootstrap)):
        raise HivemindError(
            f"none of the {len(bootstrap)} initial peers answered a hivemind DHT ping "
            "(is this a hivemind 1.1 swarm? its peers must not run in client mode)"
        )
    return HivemindMember(host, dht, refusals)


__all__ = ["HivemindMember", "join_member"]
