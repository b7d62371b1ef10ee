"""What the CLI prints of peers and of a session: one short form of a peer ID everywhere
(``widgets.short``), and ``join``'s exit lines: hand-offs and what this session gave."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from volunteer.cli.joincmd import farewell_lines
from volunteer.net.identity import KeyPair
from volunteer.widgets import short

CLI = Path(__file__).resolve().parents[2] / "volunteer" / "cli"
# a peer ID or address cut by hand ("peer[-10:]", "…" + relay[-6:]) instead of through short()
HAND_CUT = re.compile(r"(peer|relay)[^\n]{0,40}\[-\d+:\]")


def test_cli_output_cuts_peer_ids_only_through_short():
    # webpage.py is left out: the pages helper moves its markup into templates, which use short()
    cut = [f"{path.name}:{n}" for path in sorted(CLI.glob("*.py")) if path.name != "webpage.py"
           for n, text in enumerate(path.read_text().splitlines(), 1) if HAND_CUT.search(text)]
    assert cut == []


def test_the_short_form_is_the_peer_ids():
    peer = KeyPair.generate().peer_id
    assert short(str(peer)) == peer.short() == "…" + str(peer)[-6:]
    assert short(f"/ip4/127.0.0.1/tcp/1/p2p/{peer}") == peer.short()  # an address names its peer


def test_join_says_what_it_handed_off_and_what_the_session_gave():
    peer = str(KeyPair.generate().peer_id)
    handed = SimpleNamespace(done={"expert.0.1": (peer, 7)}, failed={"expert.0.2": "no peer took it"})
    snapshot = {"uptime_s": 3723.0, "contributions": {"session": {"requests": 1234, "samples": 45600, "compute_s": 12.0,
                                                                  "bytes_sent": 3 * 2**20, "trainers": 2}}}
    lines = farewell_lines(handed, snapshot, joined=True)
    assert lines[0] == f"  handed off expert.0.1 (version 7) to {short(peer)}"
    assert lines[1] == "  could not hand off expert.0.2: no peer took it (its checkpoint keeps it)"
    assert lines[2] == "left the swarm: experts withdrawn, checkpoints saved"
    assert lines[3] == "this session: 1h02m up, 1,234 calls, 45,600 samples for 2 trainers, 3.0 MiB sent"


def test_a_daemon_that_never_joined_says_so_and_gave_nothing():
    assert farewell_lines(None, {"uptime_s": 5.0}, joined=False) == ["stopped: never joined the swarm (no consent given)"]
