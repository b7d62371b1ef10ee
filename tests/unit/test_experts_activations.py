"""Kept forward graphs (activations.py) and the backend's deferred step: bounds, staleness, and
results equal to the recomputing path."""

from __future__ import annotations

import copy

import pytest
import torch

from volunteer.errors import ExpertConfigError
from volunteer.experts import ExpertsConfig, make_backend
from volunteer.experts.activations import ActivationCache, same_tensors

CONFIG = ExpertsConfig(device="cpu")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def graph_of(backend, x):
    return backend.forward_keeping_graph([x])[1]


@pytest.mark.slow
def test_backward_from_a_kept_graph_equals_recomputing():
    backend = make_backend("ffn.0", "ffn", 16, config=CONFIG)
    twin = copy.deepcopy(backend)
    x, g = torch.randn(4, 16), torch.randn(4, 16)
    (y,), graph = backend.forward_keeping_graph([x])
    assert not y.requires_grad and torch.equal(y, twin.forward([x])[0])
    assert graph.nbytes > 0  # activations are counted, the parameters are not
    assert graph.nbytes < sum(p.nelement() * p.element_size() for p in backend.module.parameters())
    (dx,) = backend.backward_from_graph(graph, [g])
    (want,) = twin.backward([x], [g])
    assert torch.equal(dx, want)
    assert backend.updates == twin.updates == 1
    for mine, theirs in zip(backend.module.parameters(), twin.module.parameters()):
        assert torch.equal(mine, theirs)  # the same step from the same gradients


def test_a_graph_is_stale_after_any_change_to_the_module():
    backend = make_backend("ffn.0", "ffn", 8, config=CONFIG)
    x, g = torch.randn(2, 8), torch.randn(2, 8)
    graph = graph_of(backend, x)
    backend.backward([x], [g])  # a step: every parameter's version moves
    with pytest.raises(ExpertConfigError, match="stale"):
        backend.backward_from_graph(graph, [g])
    graph = graph_of(backend, x)
    with torch.no_grad():
        backend.module.norm.bias.add_(1.0)  # an in-place change without a step (a replica's import)
    assert graph.state != backend.state_fingerprint()
    graph = graph_of(backend, x)
    backend.module.eval()
    assert graph.state != backend.state_fingerprint()


def test_a_deferred_step_is_counted_at_once_and_applied_before_anything_reads_the_module():
    backend = make_backend("ffn.0", "ffn", 8, config=CONFIG)
    twin = copy.deepcopy(backend)
    x, g = torch.randn(2, 8), torch.randn(2, 8)
    before = [p.detach().clone() for p in backend.module.parameters()]
    backend.backward([x], [g], defer_step=True)
    assert backend.updates == 1 and backend.step_owed and backend.dirty
    assert all(torch.equal(p, b) for p, b in zip(backend.module.parameters(), before))  # not applied yet
    twin.backward([x], [g])
    # forward settles the owed step first: it sees the updated parameters
    assert torch.equal(backend.forward([x])[0], twin.forward([x])[0])
    assert not backend.step_owed
    backend.backward([x], [g], defer_step=True)
    twin.backward([x], [g])
    state = backend.state_dict()  # a checkpoint never misses an owed step
    assert state["updates"] == 2 and not backend.step_owed
    for mine, theirs in zip(state["module"].values(), twin.module.state_dict().values()):
        assert torch.equal(mine, theirs)


def test_same_tensors_checks_everything():
    a = torch.arange(6.0).reshape(2, 3)
    assert same_tensors([a], [a.clone()])
    assert not same_tensors([a], [a.clone(), a])
    assert not same_tensors([a], [a.reshape(3, 2)])
    assert not same_tensors([a], [a.double()])
    b = a.clone()
    b[1, 2] += 1
    assert not same_tensors([a], [b])


def test_the_cache_is_bounded_in_count_bytes_and_time():
    backend = make_backend("ffn.0", "ffn", 8, config=CONFIG)
    state = backend.state_fingerprint()
    inputs = [torch.full((2, 8), float(i)) for i in range(4)]
    graphs = [graph_of(backend, x) for x in inputs]
    size = graphs[0].nbytes

    cache = ActivationCache(max_entries=2, max_bytes=10 * size, ttl=60)
    for x, graph in zip(inputs[:3], graphs):
        assert cache.put("ffn.0", graph, now=0)
    assert len(cache) == 2 and cache.nbytes == 2 * size  # the oldest went
    assert cache.take("ffn.0", [inputs[0]], state, now=1) is None
    assert cache.take("ffn.0", [inputs[2]], state, now=1) is graphs[2]
    assert cache.take("ffn.0", [inputs[2]], state, now=1) is None  # a graph is used once
    assert (cache.hits, cache.misses) == (1, 2)

    by_bytes = ActivationCache(max_entries=100, max_bytes=2 * size, ttl=60)
    for graph in graphs:
        by_bytes.put("ffn.0", graph, now=0)
    assert len(by_bytes) == 2 and by_bytes.nbytes <= 2 * size
    assert not ActivationCache(max_entries=100, max_bytes=size - 1, ttl=60).put("ffn.0", graphs[0], now=0)

    by_time = ActivationCache(max_entries=100, max_bytes=100 * size, ttl=5)
    by_time.put("ffn.0", graphs[0], now=0)
    by_time.put("ffn.0", graphs[1], now=3)
    assert by_time.take("ffn.0", [inputs[0]], state, now=5) is None  # expired at 5
    assert len(by_time) == 1
    by_time.expire(now=8)
    assert len(by_time) == 0 and by_time.nbytes == 0


def test_the_cache_answers_only_its_expert_and_state_and_drops_what_a_step_outdated():
    backend = make_backend("ffn.0", "ffn", 8, config=CONFIG)
    x = torch.randn(2, 8)
    old_state = backend.state_fingerprint()
    cache = ActivationCache(max_entries=8, max_bytes=1 << 30, ttl=60)
    cache.put("ffn.0", graph_of(backend, x), now=0)
    cache.put("ffn.1", graph_of(backend, x), now=0)
    assert cache.take("ffn.2", [x], old_state, now=0) is None
    backend.backward([x], [torch.randn(2, 8)])
    assert cache.take("ffn.0", [x], backend.state_fingerprint(), now=0) is None  # taken before the step
    cache.drop_stale("ffn.0", backend.state_fingerprint())
    assert len(cache) == 1  # ffn.1's graph stays: another expert
    cache.drop("ffn.1")
    assert len(cache) == 0 and cache.nbytes == 0
    assert not ActivationCache(0, 1 << 30, 60).enabled and ActivationCache(1, 1, 1).enabled


def test_a_forward_request_announces_its_backward_in_an_optional_field():
    from volunteer.experts.protocol import Request, unpack

    header = {"t": [], "n": 0}
    announced = Request("forward", "ffn.0", tensors=header, keep_graph=True)
    assert unpack(announced.encode()[1:])["g"] is True
    assert Request.from_message(announced.to_message()).keep_graph
    plain = Request("forward", "ffn.0", tensors=header)
    assert "g" not in plain.to_message()  # what older servers always saw
    assert not Request.from_message(plain.to_message()).keep_graph
    assert not Request.from_message({**plain.to_message(), "g": 1}).keep_graph  # only a true bool counts
    backward = Request("backward", "ffn.0", tensors={"t": [{}, {}], "n": 0}, n_inputs=1, keep_graph=True)
    assert "g" not in backward.to_message()
