"""RemoteExpert and the expert server, driven from plain synchronous code as a trainer would:
results and gradients equal local computation, server exceptions come back with the remote
traceback, refusals and dead peers are typed errors, and the server keeps serving."""

from __future__ import annotations

import copy
import time
import traceback

import pytest
import torch

from volunteer import RemoteExpert, Swarm
from volunteer.dht import DHTConfig
from volunteer.errors import (
    ExpertInputError,
    ExpertTimeoutError,
    ExpertUnavailableError,
    RemoteExpertError,
    UnknownExpertError,
)
from volunteer.experts import ExpertsConfig, TensorSpec
from volunteer.experts.backend import ExpertBackend, make_backend
from volunteer.experts.client import DHTDirectory

from .volunteer_fixture import DHT_CONFIG, SWARM, Volunteer


class Exploding(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        return blow_up_on_purpose(x * self.w)


def blow_up_on_purpose(x):
    if bool((x > 100).any()):
        raise ArithmeticError("the custom expert refuses values above 100")
    return x


@pytest.fixture(scope="module")
def volunteer():
    config = ExpertsConfig(device="cpu")
    backends = [make_backend(f"expert.0.{j}", "ffn", 8, config=config) for j in range(2)]
    backends.append(ExpertBackend("custom.0", Exploding(), inputs=[TensorSpec((8,))], config=config))
    v = Volunteer([], backends=backends, config=config)
    yield v
    v.stop()


@pytest.fixture(scope="module")
def swarm(volunteer):
    s = Swarm.join(volunteer.spec(), dht_config=DHT_CONFIG)
    yield s
    s.close()


def test_forward_and_backward_match_local_computation(volunteer, swarm):
    local = copy.deepcopy(volunteer.runtime.backends["expert.0.0"].module)
    remote = RemoteExpert("expert.0.0", str(volunteer.host.peer_id), swarm, compression="none")
    assert remote.info["outputs"][0]["s"] == [8]
    x = torch.randn(5, 8, requires_grad=True)
    x_local = x.detach().clone().requires_grad_()
    y = remote(x)
    y_local = local(x_local)
    assert torch.allclose(y, y_local, atol=1e-5)
    weights = torch.randn(5, 8)
    (y * weights).sum().backward()
    (y_local * weights).sum().backward()
    assert torch.allclose(x.grad, x_local.grad, atol=1e-5)
    assert volunteer.runtime.backends["expert.0.0"].updates == 1  # backward stepped the optimizer


def test_server_exception_carries_remote_traceback_and_server_keeps_serving(volunteer, swarm):
    remote = RemoteExpert("custom.0", volunteer.addr, swarm)
    with pytest.raises(RemoteExpertError) as caught:
        remote(torch.full((2, 8), 500.0))
    error = caught.value
    assert error.error_type == "ArithmeticError" and "refuses values above 100" in str(error)
    assert "blow_up_on_purpose" in error.remote_traceback and "\n" not in str(error)
    assert "blow_up_on_purpose" in "".join(traceback.format_exception(error))  # printed with its traceback
    assert error.expert_uid == "custom.0" and error.peer_id == str(volunteer.host.peer_id)
    assert remote(torch.ones(2, 8)).shape == (2, 8)  # same expert, good input: served


def test_bad_shapes_dtypes_and_unknown_uids_are_typed_errors(volunteer, swarm):
    remote = RemoteExpert("expert.0.1", volunteer.addr, swarm)
    with pytest.raises(RemoteExpertError, match="ExpertInputError") as caught:
        remote(torch.randn(3, 7))
    assert "expert.0.1" in str(caught.value)
    with pytest.raises(RemoteExpertError, match="ExpertInputError"):
        remote(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(UnknownExpertError):
        RemoteExpert("expert.9.9", volunteer.addr, swarm)(torch.randn(1, 8))
    assert remote(torch.randn(1, 8)).shape == (1, 8)


def test_a_cached_schema_refuses_a_wrong_width_locally(volunteer, swarm):
    remote = RemoteExpert("expert.0.1", volunteer.addr, swarm)
    assert remote.info["inputs"] == [{"s": [8], "d": "float32"}]  # asked once, then cached
    before = volunteer.runtime.stats()["expert.0.1"]
    with pytest.raises(ExpertInputError, match=r"expert 'expert.0.1'.*input 0: got float32\[3, 7\], expected float32\[batch, 8\]"):
        remote(torch.randn(3, 7))
    with pytest.raises(ExpertInputError, match="float64"):
        remote(torch.randn(3, 8, dtype=torch.float64))
    after = volunteer.runtime.stats()["expert.0.1"]
    assert (after.requests, after.errors) == (before.requests, before.errors)  # nothing reached the server
    assert remote(torch.randn(2, 8)).shape == (2, 8)


def test_compression_round_trip(volunteer, swarm):
    exact = RemoteExpert("expert.0.1", volunteer.addr, swarm, compression="none")
    half = RemoteExpert("expert.0.1", volunteer.addr, swarm, compression="float16")
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert torch.allclose(exact(x), half(x), atol=1e-2)


def test_unreachable_peer_and_timeouts(volunteer, swarm):
    from volunteer.net.identity import KeyPair

    ghost = f"/ip4/127.0.0.1/tcp/9/p2p/{KeyPair.generate().peer_id}"
    started = time.monotonic()
    with pytest.raises(ExpertUnavailableError):
        RemoteExpert("expert.0.0", ghost, swarm, forward_timeout=5)(torch.randn(1, 8))
    assert time.monotonic() - started < 5

    async def hang(stream):
        import trio

        await trio.sleep_forever()

    async def install():
        volunteer.host.set_handler("/volunteer/hangswarm/experts/1.0.0", hang)

    volunteer.loop.run(install)

    class Other:  # the same Host, calling experts of another swarm
        loop, host, swarm_id, faults, calls, vouches = swarm.loop, swarm.host, "hangswarm", None, swarm.calls, swarm.vouches
        directory = DHTDirectory(swarm.host, swarm.dht, "hangswarm")

    started = time.monotonic()
    with pytest.raises(ExpertTimeoutError, match="did not answer forward within 0.5 s"):
        RemoteExpert("expert.0.0", volunteer.addr, Other(), forward_timeout=0.5)(torch.randn(1, 8))
    assert time.monotonic() - started < 3


def test_swarm_queries(volunteer, swarm):
    found = swarm.get_experts(["expert.0.0", "expert.5.5"])
    assert [d.peer for d in found["expert.0.0"]] == [volunteer.host.peer_id] and found["expert.5.5"] == []
    assert sorted(swarm.list_experts("expert.")) == ["expert.0.0", "expert.0.1"]
    best = swarm.find_best_experts("expert", [[1.0], [0.0, 2.0]], beam_size=1)
    assert [m.uid for m in best] == ["expert.0.1"]
