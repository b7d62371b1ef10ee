"""Hand-off on leave over the memory transport with real ffn backends: the receiver of an expert
no other replica holds ends hosting it at the leaver's version and state; a full receiver makes
the leaver try the next candidate; a dead candidate costs no more than the hand-off bound."""

from __future__ import annotations

from contextlib import asynccontextmanager

import torch
import trio

from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.replicas.config import ReplicasConfig
from volunteer.replicas.handoff import hand_off, plan_handoff
from volunteer.replicas.state import state_digest
from volunteer.replicas.store import BackendStore
from volunteer.replicas.transfer import StateService

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
EXPERTS = ExpertsConfig(device="cpu")
SWARM = "ho"


def trained(uid: str, steps: int):
    backend = make_backend(uid, "ffn", 8, config=EXPERTS)
    for _ in range(steps):
        backend.backward([torch.randn(4, 8)], [torch.randn(4, 8)])
    return backend


def receiver_store(capacity: int) -> BackendStore:
    return BackendStore(
        {}, capacity=capacity,
        factory=lambda header: make_backend(header.uid, header.expert_class, header.hidden_dim, config=EXPERTS),
    )


@asynccontextmanager
async def node(network, store):
    async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET,
                         services=[StateService(SWARM, store)]) as host:
        yield host


async def test_a_leavers_sole_expert_is_hosted_by_the_receiver_at_the_leavers_version():
    network = MemoryNetwork()
    leaving = {"expert.0.0": trained("expert.0.0", 4), "expert.0.1": trained("expert.0.1", 2)}
    leaver_store = BackendStore(leaving)
    full, roomy = receiver_store(0), receiver_store(4)
    async with node(network, leaver_store) as leaver, node(network, full) as host_full, node(network, roomy) as host_roomy:
        me = str(leaver.peer_id)
        hosts = {"expert.0.0": {me: 4}, "expert.0.1": {me: 2, str(host_roomy.peer_id): 2}}
        # the full one claims more room than it has: the leaver falls back to the next candidate
        spare = {str(host_full.peer_id): 5, str(host_roomy.peer_id): 4}
        plan = plan_handoff(leaver_store.versions(), hosts, spare, me=me)
        assert [p.uid for p in plan.pushes] == ["expert.0.0"] and plan.covered == ("expert.0.1",)
        assert plan.pushes[0].candidates[0] == str(host_full.peer_id)
        addrs = {str(h.peer_id): h.full_addrs()[0] for h in (host_full, host_roomy)}
        result = await hand_off(leaver, plan, leaver_store, swarm_id=SWARM, addrs=addrs)
    assert result.done == {"expert.0.0": (str(host_roomy.peer_id), 4)} and result.failed == {}
    taken = roomy.backends["expert.0.0"]
    assert taken.updates == leaving["expert.0.0"].updates == 4
    assert state_digest(taken) == state_digest(leaving["expert.0.0"])
    assert full.backends == {}


async def test_an_unreachable_receiver_fails_within_the_bound_and_is_reported(autojump_clock):
    network = MemoryNetwork()
    leaver_store = BackendStore({"expert.0.0": trained("expert.0.0", 1)})

    async def blackhole(stream):  # takes the offer and never answers
        await trio.sleep_forever()

    async with node(network, leaver_store) as leaver, node(network, receiver_store(1)) as stuck:
        stuck.set_handler(f"/volunteer/{SWARM}/expert-state/1.0.0", blackhole)
        me = str(leaver.peer_id)
        plan = plan_handoff(leaver_store.versions(), {}, {str(stuck.peer_id): 1, "gone": 1}, me=me)
        start = trio.current_time()
        result = await hand_off(leaver, plan, leaver_store, swarm_id=SWARM,
                                addrs={str(stuck.peer_id): stuck.full_addrs()[0]}, config=ReplicasConfig(handoff_timeout=20))
        assert trio.current_time() - start <= 20 + 1e-6
    assert result.done == {} and "expert.0.0" in result.failed
