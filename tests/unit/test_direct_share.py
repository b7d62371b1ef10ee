"""The share of peer sessions that ended direct and of bytes that went direct (``nat.share``),
as iroh exports them; the swarm's relays are infrastructure and do not count."""

from volunteer.cli.metrics import direct_metrics
from volunteer.net.identity import KeyPair
from volunteer.net.nat.share import DirectShare


def test_sessions_and_bytes_that_went_direct():
    relay, a, b, c = (KeyPair.generate().peer_id for _ in range(4))
    share = DirectShare({relay})
    assert share.view([]) ["direct_connection_share"] is None
    share.connected(relay, True)
    share.connected(a, False)  # relayed first, then punched
    share.connected(a, True)
    share.closed(a, False, 1_000, last=False)
    share.closed(a, True, 9_000, last=True)
    share.connected(b, False)  # stayed relayed
    share.closed(b, False, 10_000, last=True)
    share.closed(relay, True, 50_000, last=True)
    view = share.view([(c, True, 5_000), (relay, True, 7)])
    assert (view["peer_sessions"], view["peer_sessions_direct"]) == (3, 2)
    assert view["direct_connection_share"] == round(2 / 3, 4)
    assert (view["bytes_direct"], view["bytes_relayed"]) == (14_000, 11_000)
    assert view["direct_data_share"] == round(14_000 / 25_000, 4)
    names = {m.name for m in direct_metrics(view)}
    assert {"volunteer_direct_connection_share", "volunteer_direct_data_share", "volunteer_peer_bytes"} <= names
