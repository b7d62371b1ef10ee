"""HivemindExpert: our client for experts on hivemind servers, here against our HivemindExperts
(the interop tests meet hivemind's own server): results, our timeouts and our error types."""

from __future__ import annotations

from contextlib import AsyncExitStack

import numpy as np
import pytest
import trio

from volunteer.errors import (
    ExpertBackwardRefusedError,
    ExpertTimeoutError,
    ExpertUnavailableError,
    RemoteExpertError,
    UnknownExpertError,
)
from volunteer.hivemind import HivemindRPCError
from volunteer.hivemind import expert_wire as wire
from volunteer.hivemind.client import HivemindExpert, find_experts, remote_error
from volunteer.net.identity import KeyPair
from volunteer.hivemind.rpc import serve_unary

from .test_hivemind_experts import HIDDEN, setup


@pytest.mark.trio_timeout(30)
async def test_forward_backward_info_and_discovery(monkeypatch):
    async with AsyncExitStack() as stack:
        server, client, client_dht, experts, runtime = await setup(stack)
        with trio.fail_after(10):
            while len(experts.declared) != 2:
                await trio.sleep(0.01)
        assert await find_experts(client_dht, ["ffn.0", "ffn.7"]) == {"ffn.0": server.peer_id, "ffn.7": None}
        expert = HivemindExpert(client, "ffn.0", server.peer_id)
        assert (await expert.info())["keyword_names"] == ()
        x = np.random.default_rng(1).standard_normal((3, HIDDEN)).astype(np.float32)
        (y,) = await expert.forward([x])
        # a payload above hivemind's unary bound goes over the stream RPC, as hivemind's client
        # does (the bound lowered so that a batch the expert accepts crosses it)
        with monkeypatch.context() as patch:
            patch.setattr("volunteer.hivemind.client.MAX_UNARY_PAYLOAD", x.nbytes - 1)
            patch.setattr("volunteer.hivemind.client.call_unary", None)  # the unary RPC is not used
            (y_streamed,) = await expert.forward([x])
        np.testing.assert_allclose(y_streamed, y, rtol=1e-6)
        (grad,) = await expert.backward([x], [np.ones_like(y)])
        assert y.shape == grad.shape == (3, HIDDEN)


@pytest.mark.trio_timeout(30)
async def test_failures_come_out_as_our_error_types():
    async with AsyncExitStack() as stack:
        server, client, _, experts, runtime = await setup(stack)
        x = np.zeros((2, HIDDEN), np.float32)
        with pytest.raises(RemoteExpertError) as caught:
            await HivemindExpert(client, "ffn.0", server.peer_id).forward([np.zeros((2, 3), np.float32)])
        assert caught.value.error_type == "ExpertInputError" and caught.value.expert_uid == "ffn.0"
        with pytest.raises(UnknownExpertError):
            await HivemindExpert(client, "ffn.9", server.peer_id).forward([x])
        with pytest.raises(ExpertBackwardRefusedError):
            await HivemindExpert(client, "ffn.1", server.peer_id).backward([x], [x])

        async def never(data, sender):
            await trio.sleep_forever()

        server.set_handler(wire.FORWARD, lambda s: serve_unary(s, never, timeout=30))
        with pytest.raises(ExpertTimeoutError):
            await HivemindExpert(client, "ffn.0", server.peer_id, forward_timeout=0.5).forward([x])
        with pytest.raises(ExpertUnavailableError):
            await HivemindExpert(client, "ffn.0", KeyPair.generate().peer_id).forward([x])


def test_hivemind_error_texts_map_to_types():
    peer = KeyPair.generate().peer_id
    error = remote_error(HivemindRPCError("KeyError('ffn.9')"), "ffn.9", peer)
    assert isinstance(error, RemoteExpertError) and (error.error_type, error.remote_message) == ("KeyError", "ffn.9")
    error = remote_error(HivemindRPCError("something odd"), "ffn.9", peer)
    assert isinstance(error, RemoteExpertError) and error.error_type == "RemoteError"
