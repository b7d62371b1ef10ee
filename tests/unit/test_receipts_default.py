"""Receipts are on by default for swarms of our kind: a swarm file that says nothing asks for
exact audits, one that says ``receipts = false`` opts out (and keeps saying so when written back),
and a hivemind swarm, whose wire carries no receipts, never has them."""

from __future__ import annotations

import pytest

from volunteer.net.identity import KeyPair
from volunteer.swarmfile import SwarmFileError, SwarmSpec, load_swarm_file

ADDR = f"/ip4/203.0.113.7/tcp/4001/p2p/{KeyPair.generate().peer_id}"


def test_a_swarm_of_our_kind_has_receipts_unless_its_file_opts_out(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\nbootstrap = ["{ADDR}"]\n')
    assert load_swarm_file(path).receipts is True
    assert SwarmSpec("s", "s").receipts is True
    path.write_text(f'name = "s"\nbootstrap = ["{ADDR}"]\nreceipts = false\n')
    opted_out = load_swarm_file(path)
    assert opted_out.receipts is False
    path.write_text(opted_out.to_toml())  # written back, it still opts out
    assert load_swarm_file(path).receipts is False
    path.write_text(SwarmSpec("s", "s").to_toml())
    assert load_swarm_file(path).receipts is True


def test_a_hivemind_swarm_never_has_receipts(tmp_path):
    path = tmp_path / "h.toml"
    path.write_text(f'name = "h"\nkind = "hivemind"\nbootstrap = ["{ADDR}"]\n')
    assert load_swarm_file(path).receipts is False
    assert SwarmSpec("h", "h", kind="hivemind").receipts is False
    path.write_text(f'name = "h"\nkind = "hivemind"\nbootstrap = ["{ADDR}"]\nreceipts = true\n')
    with pytest.raises(SwarmFileError, match="carry no receipts"):
        load_swarm_file(path)

