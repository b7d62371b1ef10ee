"""A volunteer node's membership of a hivemind swarm: the service that joins hivemind's DHT.

A node of a ``kind = "hivemind"`` swarm runs, instead of our DHT and declarer, hivemind's DHT
(``HivemindDHT``), the refusals of what we do not speak (``HivemindRefusals``), kad peer routing
(``KadPeerRouting``), this ``HivemindMember`` (which joins through the swarm's initial peers before
it reports started) and, when it hosts experts, ``HivemindExperts`` (declaring every 30 s); the
list is ``volunteer.kinds.hivemind``'s.

Our swarm id never goes on hivemind's wire (hivemind has no such thing). What we do not speak of
hivemind (averaging, signed-record validators, authorizers) is refused where it is asked for:
the swarm file (``swarmfile.HIVEMIND_UNSUPPORTED``), the DHT's ``auth`` fields, and on the wire
(``unsupported.HivemindRefusals`` answers averaging RPCs with an error saying so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from ..errors import JoinError
from ..net.multiaddr import Multiaddr
from ..dht.status import DHTPanel
from ..net.service import BaseService, HostAPI
from .dht import HivemindDHT

if TYPE_CHECKING:
    from .experts import HivemindExperts


class HivemindMember(BaseService):
    """Joins hivemind's DHT through ``bootstrap`` (its initial peers; none: we are the first)
    before it reports started; JoinError when initial peers were given and none answers a
    hivemind ping. ``snapshot()`` is the DHT panel of ``volunteer status`` for such a node."""

    def __init__(
        self, dht: HivemindDHT, bootstrap: Sequence[Multiaddr] = (), *, experts: "HivemindExperts | None" = None,
        swarm_name: str = "",
    ) -> None:
        self.dht = dht
        self.bootstrap = list(bootstrap)
        self.experts = experts
        self.swarm_name = swarm_name
        self.joined_through = 0  # initial peers that answered

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        if self.bootstrap:
            self.joined_through = await self.dht.bootstrap(self.bootstrap)
            if not self.joined_through:
                raise JoinError(
                    f"cannot join hivemind swarm {self.swarm_name!r}: none of the {len(self.bootstrap)} initial peers "
                    "answered a hivemind DHT ping (is this a hivemind 1.1 swarm? its peers must not run in client mode)"
                )
        task_status.started()

    def snapshot(self) -> DHTPanel:
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


__all__ = ["HivemindMember"]
