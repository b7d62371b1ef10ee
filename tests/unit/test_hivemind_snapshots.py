"""A hivemind swarm's directory answers the snapshot an exact audit asks for (``fetch_snapshot``,
through the ``ExpertDirectory`` protocol) with a clear ExpertUnavailableError, which the auditor
counts as a missing snapshot: hivemind signs no receipts, so there is none to serve."""

from __future__ import annotations

import pytest
import trio

from volunteer.errors import ExpertUnavailableError
from volunteer.experts.client import fetch_snapshot
from volunteer.hivemind.trainer import HivemindDirectory
from volunteer.net.identity import KeyPair


async def test_a_hivemind_directory_serves_no_snapshot():
    directory = HivemindDirectory(host=None, dht=None)  # refused before either is used
    peer = KeyPair.generate().peer_id
    with trio.fail_after(5):
        with pytest.raises(ExpertUnavailableError, match="no snapshots"):
            await fetch_snapshot(directory, peer, "ffn.0", b"\x01" * 32)
        with pytest.raises(ExpertUnavailableError, match="no snapshots"):
            await directory.call_expert(peer, "ffn.0", "forward", digest=b"\x01" * 32)
