"""A donor's share of the CPU: ``cpu_threads`` (``--cpu-threads``, ``[join] cpu_threads``) is the
number of threads torch computes the experts with, where torch alone would take every core."""

from __future__ import annotations

import torch

from volunteer.experts import ExpertsConfig
from volunteer.net.stack import StackOptions
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.swarmfile import SwarmSpec

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


async def test_a_volunteer_computes_with_the_threads_it_was_given():
    before = torch.get_num_threads()
    try:
        options = VolunteerOptions(listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, nat=False, mdns=False,
                                   experts_config=ExpertsConfig(device="cpu"), expert_class="ffn", uids=["ffn.0.0"],
                                   hidden_dim=8, cpu_threads=1)
        async with open_volunteer(SwarmSpec("threads", "threads", [], []), options) as node:
            assert torch.get_num_threads() == 1 and node.runtime is not None
    finally:
        torch.set_num_threads(before)
