"""Reaching a swarm's entry points: an address whose /p2p/ id is not the node's that answers there
is said as such, with both ids whole and the file to fix, never as "did not answer"."""

from __future__ import annotations

from pathlib import Path

import pytest

from volunteer.errors import JoinError, PeerIDMismatch
from volunteer.kinds.entry import reach_swarm
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.stack import StackOptions, open_stack
from volunteer.swarmfile import SwarmSpec

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
LOOPBACK = "/ip4/127.0.0.1/tcp/0"


@pytest.mark.parametrize("kind", ["relay", "bootstrap peer"])
async def test_a_wrong_peer_id_in_the_swarm_file_names_who_answered_and_the_file(kind):
    async with open_stack(listen=[LOOPBACK], options=QUIET) as entry, open_stack(listen=[LOOPBACK], options=QUIET) as host:
        wrong = KeyPair.generate().peer_id
        addr = Multiaddr(f"{entry.listen_addrs[0]}/p2p/{wrong}")
        relays = [addr] if kind == "relay" else []
        spec = SwarmSpec("demo", "demo", [addr], relays, path=Path("demo.toml"))
        with pytest.raises(JoinError) as refused:
            await reach_swarm(host, spec)
    port = str(entry.listen_addrs[0]).rsplit("/", 1)[1]
    assert str(refused.value) == (
        f"cannot join swarm 'demo': its {kind} 127.0.0.1:{port} answered as peer {entry.peer_id}, not {wrong} as its "
        "address says: the address's /p2p/ id is wrong, or that node has a new identity; ask for its current address "
        "(fix swarm file demo.toml)"
    )


def test_the_advice_is_one_line_with_whole_ids():
    expected, answered = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    wrong = PeerIDMismatch.between(expected, answered)
    assert str(wrong) == f"dialled {expected} but {answered} answered"
    assert PeerIDMismatch.inside(wrong) is wrong
    line = wrong.advice("/ip4/127.0.0.1/tcp/4001")
    assert str(expected) in line and str(answered) in line and "\n" not in line
