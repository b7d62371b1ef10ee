"""Swarm files of ``kind = "hivemind"``: parsed, round-tripped, and hivemind features we do not
speak refused with a clear message."""

from __future__ import annotations

import pytest

from volunteer.swarmfile import SwarmFileError, load_swarm_file

PEER = "/ip4/127.0.0.1/tcp/4001/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def test_a_hivemind_swarm_file_round_trips_and_id_defaults_to_the_name(tmp_path):
    path = tmp_path / "petals.toml"
    path.write_text(f'name = "petals"\nkind = "hivemind"\nbootstrap = ["{PEER}"]\n')
    spec = load_swarm_file(path)
    assert (spec.kind, spec.id, [str(a) for a in spec.bootstrap]) == ("hivemind", "petals", [PEER])
    again = tmp_path / "again.toml"
    again.write_text(spec.to_toml())
    assert load_swarm_file(again).kind == "hivemind"
    plain = tmp_path / "plain.toml"
    plain.write_text('name = "plain"\n')
    assert load_swarm_file(plain).kind == "volunteer"
    assert "kind" not in load_swarm_file(plain).to_toml()


@pytest.mark.parametrize(
    "extra, message",
    [
        ('kind = "bittorrent"', "kind must be one of volunteer, hivemind"),
        ('kind = "hivemind"\n[averaging]\ntarget_group_size = 4', "averaging.*not supported"),
        ('kind = "hivemind"\nvalidators = ["rsa"]', "signed-record validators.*not supported"),
    ],
)
def test_unknown_kinds_and_unsupported_hivemind_features_are_refused(tmp_path, extra, message):
    path = tmp_path / "swarm.toml"
    path.write_text(f'name = "s"\n{extra}\n')
    with pytest.raises(SwarmFileError, match=message):
        load_swarm_file(path)
