"""Fixtures for the network-namespace NAT rig (tests marked ``nat``).

``make_rig(spec)`` brings a rig up and tears it down after the test, pass or fail; the
session first deletes namespaces left behind by killed runs (``cleanup_stale``). Without root
or a usable ``ip netns`` the tests skip with the reason, or fail when the environment sets
``VOLUNTEER_REQUIRE_NAT_RIG=1`` (CI does: there the rig must run).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.nat import rig as rigmod


@pytest.fixture(scope="session")
def nat_ok() -> None:
    """Skip (or fail, under VOLUNTEER_REQUIRE_NAT_RIG=1) when the rig cannot run here."""
    reason = rigmod.unusable_reason()
    if reason:
        if os.environ.get("VOLUNTEER_REQUIRE_NAT_RIG") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    rigmod.cleanup_stale()


@pytest.fixture
def make_rig(nat_ok: None) -> Iterator[Callable[[rigmod.Spec], rigmod.Rig]]:
    """A factory: ``make_rig(spec) -> Rig`` (up); every rig made is torn down afterwards."""
    rigs: list[rigmod.Rig] = []

    def make(spec: rigmod.Spec) -> rigmod.Rig:
        r = rigmod.Rig(spec)
        rigs.append(r)
        return r.up()

    yield make
    for r in rigs:
        r.down()


@pytest.fixture
def easy_rig(make_rig) -> rigmod.Rig:
    """``easy_pair()``: peer_a / peer_b behind EIM NATs, relay, public, observer."""
    return make_rig(rigmod.easy_pair())


@pytest.fixture
def symmetric_rig(make_rig) -> rigmod.Rig:
    """``symmetric_pair()``: peer_a behind a symmetric NAT, peer_b behind EIM."""
    return make_rig(rigmod.symmetric_pair())


@pytest.fixture
def double_nat_rig(make_rig) -> rigmod.Rig:
    """``double_nat_pair()``: peer_a behind home NAT behind carrier-grade NAT."""
    return make_rig(rigmod.double_nat_pair())
