"""A running node is a list of Host services: a newcomer's protocol is one more service in a list
(``VolunteerOptions.services`` for one node, a kind's ``node_parts`` for every node of a kind),
started after the kind's own and reachable from other nodes, with nothing in ``node.py`` changed;
and a third swarm kind is one more ``SwarmKind`` in the registry."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio

from volunteer.dht import DHTConfig
from volunteer.dht.node import DHTNode
from volunteer.errors import VolunteerError
from volunteer.experts import ExpertsConfig
from volunteer.kinds import KINDS, Check, DoctorPlan, ExpertListing, NodeContext, NodeParts, TrainerParts
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.service import BaseService, HostAPI
from volunteer.net.stack import StackOptions
from volunteer.net.streams import BufferedStream
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.swarmfile import SwarmSpec

SWARM = "servicetest"
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
DHT = DHTConfig(swarm_id=SWARM)


class Greeter(BaseService):
    """A newcomer's toy protocol: answers a name with a greeting naming the node and, if the node
    runs our DHT, how many peers its table holds (a collaborator found through the Host)."""

    PROTOCOL = "/toy/greet/1.0.0"

    def __init__(self) -> None:
        self.greeted: list[str] = []
        self.table_at_start: int | None = None

    def handlers(self):
        return {self.PROTOCOL: self._greet}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        dht = host.service(DHTNode)  # the kind's services started before ours: the DHT has joined
        self.table_at_start = len(dht.state.table) if dht is not None else None
        task_status.started()

    async def _greet(self, stream) -> None:
        reader = BufferedStream(stream)
        name = (await reader.receive_length_prefixed(64, "name")).decode()
        self.greeted.append(name)
        await reader.send_length_prefixed(f"hello {name}, from {self.host.peer_id.short()}".encode())
        await reader.send_eof()

    def snapshot(self) -> dict:
        return {"greeted": len(self.greeted)}


async def greet(host: HostAPI, target, name: str) -> str:
    reader = BufferedStream(await host.new_stream(target, [Greeter.PROTOCOL]))
    await reader.send_length_prefixed(name.encode())
    return (await reader.receive_length_prefixed(256, "greeting")).decode()


def options(**changes) -> VolunteerOptions:
    base = dict(listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, dht_config=DHT, nat=False, mdns=False)
    return VolunteerOptions(**{**base, **changes})


async def test_a_service_in_the_options_list_runs_after_the_kinds_and_is_reachable_from_another_node():
    greeter = Greeter()
    async with open_volunteer(SwarmSpec(SWARM, SWARM), options()) as seed:
        entry = seed.host.full_addrs()[0]
        spec = SwarmSpec(SWARM, SWARM, [entry], [])
        async with open_volunteer(spec, options(services=[greeter])) as node, open_volunteer(spec, options()) as other:
            assert node.host.service(Greeter) is greeter
            assert greeter.table_at_start is not None and greeter.table_at_start >= 1  # joined before we started
            reply = await greet(other.host, node.host.full_addrs()[0], "other")
            assert reply == f"hello other, from {node.host.peer_id.short()}"
            assert greeter.greeted == ["other"] and greeter.snapshot() == {"greeted": 1}
            assert other.host.service(Greeter) is None  # one node's service, not every node's


class ToyKind:
    """A third swarm kind, whole: its volunteers run the greeter and nothing of ours; it declares
    nothing, so trainers, listings and the doctor have nothing of its own to do."""

    name = "toy"

    def starting_backends(self, spec, options, build):
        return [build(uid, options.expert_class or "", options.hidden_dim) for uid in options.uids]

    def node_parts(self, node: NodeContext) -> NodeParts:
        greeter = Greeter()
        return NodeParts([greeter], dht_status=lambda: {"kind": self.name, **greeter.snapshot()})

    async def join_trainer(self, host: HostAPI, spec: SwarmSpec, *, dht_config=None) -> TrainerParts:
        raise VolunteerError(f"swarm {spec.name!r}: the toy kind has no expert directory")

    async def list_experts(self, spec: SwarmSpec, prefixes: Sequence[str]) -> ExpertListing:
        return ExpertListing([], f"toy swarm {spec.name!r}", ("uid", "host"))

    def doctor_plan(self, spec: SwarmSpec) -> DoctorPlan:
        return DoctorPlan(spec.entry_points, perf=False)

    async def check_peers(self, peers: Sequence[Multiaddr]) -> list[Check]:
        return []


@pytest.fixture
def toy_kind(monkeypatch):
    monkeypatch.setitem(KINDS, ToyKind.name, ToyKind())


async def test_a_third_swarm_kind_is_one_more_plug_in_the_registry(toy_kind):
    spec = SwarmSpec("toys", "toys", kind="toy")
    hosting = options(expert_class="ffn", uids=["ffn.0"], hidden_dim=8, experts_config=ExpertsConfig(device="cpu"))
    async with open_volunteer(spec, hosting) as first:
        entry = first.host.full_addrs()[0]
        async with open_volunteer(SwarmSpec("toys", "toys", [entry], [], kind="toy"), options()) as second:
            # the kind's list is what runs: the greeter, none of our DHT, declarer or expert server
            assert first.dht is None and first.declarer is None and first.server is None
            assert first.host.service(DHTNode) is None and first.runtime is not None
            assert await greet(second.host, entry, "second") == f"hello second, from {first.host.peer_id.short()}"
            assert first.parts.dht_status() == {"kind": "toy", "greeted": 1}
