"""Snapshots over the experts protocol: a receipt names the state that computed its reply by the
id of the host's copy, the host hashes that copy only when it is first served and signs the
binding of id to digest with it. Whatever state a host serves under an id, a reply it does not
reproduce is contradicted; and having served one, it cannot serve another under the same id."""

from __future__ import annotations

import pytest
import torch

from volunteer import Swarm
from volunteer.errors import ExpertProtocolError
from volunteer.experts.callstats import CallReport
from volunteer.experts.client import fetch_state
from volunteer.experts.recompute import Recomputer, Verdict

from .volunteer_fixture import Volunteer, volunteer_and_trainer

HIDDEN = 8


@pytest.fixture
def world():
    with volunteer_and_trainer(["ffn.0"], hidden=HIDDEN, receipts=True) as pair:
        yield pair


def forward(volunteer: Volunteer, swarm: Swarm, x: torch.Tensor):
    """A receipted forward: (outputs, receipt)."""
    async def call():
        report = CallReport()
        outputs = await swarm.directory.call_expert(volunteer.addr, "ffn.0", "forward", [x], report=report, timeout=10)
        return outputs, report.receipt

    return swarm.loop.run(call, timeout=20)


def fetch(volunteer: Volunteer, swarm: Swarm, state: bytes):
    async def call():
        return await fetch_state(swarm.directory, volunteer.addr, "ffn.0", state, timeout=10)

    return swarm.loop.run(call, timeout=20)


def test_an_honest_hosts_snapshot_is_hashed_only_when_served_and_passes_a_recompute(world):
    volunteer, swarm = world
    x = torch.randn(4, HIDDEN)
    outputs, receipt = forward(volunteer, swarm, x)
    assert receipt is not None and receipt.verify(volunteer.host.peer_id)
    assert volunteer.runtime.snapshots.report()["digested"] == 0  # the reply went without a hash of the state
    fetched = fetch(volunteer, swarm, receipt.state)
    assert fetched.binding.verify(volunteer.host.peer_id) and fetched.binding.state == receipt.state
    finding = Recomputer().check(receipt, volunteer.host.peer_id, fetched.names, fetched.tensors, [x], outputs,
                                 binding=fetched.binding)
    assert finding.verdict is Verdict.PASSED, finding
    fetch(volunteer, swarm, receipt.state)
    assert volunteer.runtime.snapshots.report()["digested"] == 1  # served twice, hashed once


def test_a_host_serving_another_state_than_it_computed_from_is_caught(world):
    volunteer, swarm = world
    x = torch.randn(4, HIDDEN)
    outputs, receipt = forward(volunteer, swarm, x)
    kept = volunteer.runtime.snapshots.get(receipt.state)
    for tensor in kept.tensors:  # a liar's store: another state under the id its receipt named
        tensor.add_(0.5)
    fetched = fetch(volunteer, swarm, receipt.state)  # bound to what it serves: the binding checks out ...
    finding = Recomputer().check(receipt, volunteer.host.peer_id, fetched.names, fetched.tensors, [x], outputs,
                                 binding=fetched.binding)
    assert finding.verdict is Verdict.CONTRADICTED, finding  # ... and the reply is a proof against it
    for tensor in kept.tensors:  # and once served, yet another state under that id is refused
        tensor.add_(0.5)
    with pytest.raises(ExpertProtocolError, match="not the state it signed"):
        fetch(volunteer, swarm, receipt.state)


def test_the_state_a_step_makes_is_copied_right_after_the_step_not_before_the_next_reply(world):
    volunteer, swarm = world
    x, g = torch.randn(4, HIDDEN), torch.randn(4, HIDDEN)

    async def forward_and_backward():
        await swarm.directory.call_expert(volunteer.addr, "ffn.0", "forward", [x], timeout=10)
        await swarm.directory.call_expert(volunteer.addr, "ffn.0", "backward", [x, g], n_inputs=1, timeout=10)

    swarm.loop.run(forward_and_backward, timeout=20)
    volunteer.loop.run(volunteer.runtime.settled, timeout=10)  # the step the backward owed is applied
    snapshots = volunteer.runtime.snapshots
    assert volunteer.runtime.backends["ffn.0"].updates == 1
    # the state before the step (which computed both replies) and the one after it, with no call since
    assert snapshots.report()["taken"] == 2 and snapshots.report()["digested"] == 0


def test_a_large_calls_inputs_digest_taken_beside_the_compute_is_the_inputs_digest(world, monkeypatch):
    import volunteer.experts.server as server
    from volunteer.experts.receipts import tensor_digest

    monkeypatch.setattr(server, "DIGEST_BESIDE_COMPUTE", 1024)  # these calls' digests run on the thread
    volunteer, swarm = world
    x, g = torch.randn(64, HIDDEN), torch.randn(64, HIDDEN)
    _, receipt = forward(volunteer, swarm, x)
    assert receipt.inputs == tensor_digest([x])

    async def backward():
        report = CallReport()
        await swarm.directory.call_expert(volunteer.addr, "ffn.0", "backward", [x, g], n_inputs=1, report=report,
                                          timeout=10)
        return report.receipt

    assert swarm.loop.run(backward, timeout=20).inputs == tensor_digest([x, g])
