"""Kept forward graphs (activations.py) and the backend's deferred step: bounds, staleness, and
results equal to the recomputing path."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from volunteer.errors import ExpertConfigError
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
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


# --- kept inputs: a backward carries only its gradients -----------------------------------------


def test_kept_inputs_go_back_only_to_their_caller_for_their_expert():
    from volunteer.experts.activations import KeptInputs

    kept = KeptInputs(max_entries=8, max_bytes=1 << 20, ttl=60)
    x = torch.randn(4, 16)
    key = kept.put("alice", "ffn.0", [x], now=0)
    assert key is not None and kept.nbytes == x.nelement() * 4
    assert kept.take("mallory", "ffn.0", key, now=1) is None  # another caller's key is nothing to them
    assert kept.take("alice", "ffn.1", key, now=1) is None  # nor to another expert
    assert kept.take("alice", "ffn.0", key, now=1)[0] is x  # the very tensor: no copy
    assert kept.take("alice", "ffn.0", key, now=1) is None  # taken once
    assert (kept.hits, kept.misses, len(kept), kept.nbytes) == (1, 3, 0, 0)


def test_kept_inputs_are_bounded_in_count_bytes_age_and_per_caller():
    from volunteer.experts.activations import KeptInputs

    kept = KeptInputs(max_entries=4, max_bytes=4 * 1024, ttl=10)
    x = torch.zeros(64, 4)  # 1 KiB
    keys = [kept.put("alice", "ffn.0", [x], now=0) for _ in range(3)]
    assert len(kept) == 2  # one caller holds at most half of the entries: its oldest went
    assert kept.take("alice", "ffn.0", keys[0], now=0) is None
    bob = [kept.put("bob", "ffn.0", [x], now=1) for _ in range(2)]
    assert len(kept) == 4 and kept.nbytes == 4 * 1024  # alice's two stay: bob took only his share
    kept.put("carol", "ffn.0", [x], now=2)
    assert len(kept) == 4 and kept.take("alice", "ffn.0", keys[1], now=2) is None  # the oldest of all went
    assert kept.put("dave", "ffn.0", [torch.zeros(1024, 4)], now=2) is None  # alone more than a caller's share
    assert kept.take("bob", "ffn.0", bob[0], now=11.5) is None  # older than the ttl
    assert len(kept) == 1 and kept.nbytes == 1024  # only carol's, from t=2, is young enough
    off = KeptInputs(max_entries=0, max_bytes=1 << 20, ttl=60)
    assert off.put("alice", "ffn.0", [x], now=0) is None


def test_a_backward_names_kept_inputs_and_a_reply_carries_key_and_volunteer_time():
    from volunteer.errors import ExpertProtocolError
    from volunteer.experts.protocol import Reply, Request, unpack

    grads = {"t": [{}], "n": 0}
    backward = Request("backward", "ffn.0", tensors=grads, n_inputs=0, kept=7)
    message = backward.to_message()
    assert message["k"] == 7 and message["ni"] == 0
    assert Request.from_message(message).kept == 7
    with pytest.raises(ExpertProtocolError):
        Request.from_message({**message, "ni": 1})  # kept inputs and inputs sent too
    for bad in (-1, 2**63, 1.5, "7", True):
        with pytest.raises(ExpertProtocolError):
            Request.from_message({**message, "k": bad})
    assert "k" not in Request("forward", "ffn.0", tensors=grads, kept=7).to_message()  # a forward names none
    reply = Reply.result({"t": [], "n": 0}, server_s=0.0123456789, kept=3)
    body = unpack(reply.encode()[1:])
    assert body["st"] == pytest.approx(0.012346) and body["k"] == 3
    back = Reply.decode(reply.encode()[1:], "forward")
    assert back.kept == 3 and back.server_s == pytest.approx(0.012346)
    assert Reply.decode(reply.encode()[1:], "backward").kept is None  # only a forward's reply keeps inputs
    plain = Reply.decode(Reply.result({"t": [], "n": 0}).encode()[1:], "forward")
    assert (plain.kept, plain.server_s) == (None, None)  # what an older server sends
    for bad in (-1.0, float("nan"), float("inf"), "1", [1]):
        with pytest.raises(ExpertProtocolError):
            Reply.decode(_packed({"ok": True, "t": {}, "st": bad}), "forward")


def _packed(message: dict) -> bytes:
    import msgpack

    return msgpack.packb(message, use_bin_type=True)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.sampled_from(["op", "uid", "c", "t", "ni", "g", "k", "ok", "st", "e", "info"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=8),
                                 st.lists(st.integers(-9, 9), max_size=3),
                                 st.dictionaries(st.text(max_size=2), st.integers(-9, 9), max_size=2)),
                       max_size=8),
       st.sampled_from(["info", "forward", "backward"]))
def test_request_and_reply_decoders_refuse_anything_odd_with_a_protocol_error(message, op):
    from volunteer.errors import ExpertProtocolError
    from volunteer.experts.protocol import Reply, Request

    for parse in (lambda: Request.from_message(message), lambda: Reply.decode(_packed(message), op)):
        try:
            parse()
        except ExpertProtocolError:
            pass
