"""hivemind RPCs we do not serve (averaging) are answered on the wire with an error that says so,
bare and under a namespace learnt later; a node joined to a hivemind swarm runs the refusals."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from volunteer.hivemind import HivemindRPCError
from volunteer.hivemind.rpc import call_stream
from volunteer.hivemind.unsupported import HivemindRefusals, averaging_protocols
from volunteer.kinds import NodeContext, kind_of
from volunteer.kinds.options import VolunteerOptions
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.swarmfile import SwarmSpec

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


async def two_hosts(stack: AsyncExitStack, services=()):
    network = MemoryNetwork()
    server = await stack.enter_async_context(
        open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=list(services))
    )
    client = await stack.enter_async_context(
        open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET)
    )
    await client.connect(server.full_addrs()[0])
    return server, client


def test_averaging_protocol_ids_follow_hivemind_servicer_naming():
    assert "DecentralizedAverager.rpc_join_group" in averaging_protocols()
    assert "run7::TrainingStateAverager.rpc_download_state" in averaging_protocols("run7")
    assert len(averaging_protocols("x")) == len(averaging_protocols()) == 15


@pytest.mark.trio_timeout(30)
async def test_averaging_calls_get_a_clear_error_bare_and_under_namespaces():
    async with AsyncExitStack() as stack:
        refusals = HivemindRefusals(namespaces=["run7"])
        server, client = await two_hosts(stack, [refusals])
        for protocol in ("DecentralizedAverager.rpc_join_group", "run7::GradientAverager.rpc_aggregate_part"):
            with pytest.raises(HivemindRPCError, match="not supported by volunteer"):
                await call_stream(client, server.peer_id, protocol, [b"\x08\x01"] * 3, timeout=10)
        refusals.refuse_namespace("late")
        with pytest.raises(HivemindRPCError, match="hivemind averaging"):
            await call_stream(client, server.peer_id, "late::TrainingStateAverager.rpc_download_state", [], timeout=10)
        assert sum(refusals.refused.values()) == 3


@pytest.mark.trio_timeout(30)
async def test_a_hivemind_member_refuses_averaging():
    async with AsyncExitStack() as stack:
        server, client = await two_hosts(stack)
        spec = SwarmSpec("hm", "hm", kind="hivemind")  # the first member: no initial peers
        for service in kind_of(spec).node_parts(NodeContext(server, spec, VolunteerOptions())).services:
            await server.add_service(service)
        assert server.service(HivemindRefusals) is not None
        with pytest.raises(HivemindRPCError, match="not supported by volunteer"):
            await call_stream(client, server.peer_id, "DecentralizedAverager.rpc_download_state", [b""], timeout=10)
