"""Shared test configuration.

Every async test runs under a ``trio.fail_after`` bound (DESIGN.md: no test may hang). Tests set
tighter bounds of their own; this is the safety net. With an autojump MockClock the bound is in
virtual time, so it still catches a test that never finishes.
"""

from __future__ import annotations

import functools
import inspect
import os

import pytest
import trio

ASYNC_TEST_TIMEOUT = 120.0

# Tests may only talk to loopback and namespaces they create: daemons they start must not send
# mDNS multicast on this machine's real interfaces (the mDNS tests bind to 127.0.0.1 explicitly).
os.environ["VOLUNTEER_NO_MDNS"] = "1"
# ... nor ask this machine's real router for port mappings (NAT-PMP, PCP, UPnP's SSDP multicast);
# the NAT rig's tests turn it back on inside their namespaces, where the routers are theirs.
os.environ["VOLUNTEER_NO_PORT_MAPPING"] = "1"


# Whole floors of the suite that start processes, namespaces or external peers: each of their
# tests takes seconds, so all of them are slow; unit and integration tests say so one by one.
SLOW_FLOORS = ("e2e", "interop", "nat", "static")
# Under pytest-xdist (`-n`, with `--dist loadgroup`, as pyproject's addopts ask) the floors whose
# tests start swarms of processes or namespaces run one test at a time, each floor on one worker:
# the NAT rig's namespaces on one, the process swarms on another, so at most two such tests share
# the machine, and the in-process floors fill the workers around them.
SERIAL_FLOORS = {"nat": "rig", "e2e": "processes", "interop": "processes"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests_root = os.path.dirname(__file__)
    for item in items:
        floor = os.path.relpath(str(item.path), tests_root).split(os.sep)[0]
        if floor in SLOW_FLOORS or item.get_closest_marker("heavy") is not None:
            item.add_marker(pytest.mark.slow)
        if floor in SERIAL_FLOORS:
            item.add_marker(pytest.mark.xdist_group(SERIAL_FLOORS[floor]))
    # minutes of full CPU (the 200-node simulation) run after everything else: the load they leave
    # on a shared 2-core machine should not reach the timing-sensitive network tests
    items.sort(key=lambda item: item.get_closest_marker("heavy") is not None)
    for item in items:
        test = getattr(item, "obj", None)
        if inspect.iscoroutinefunction(test) and not getattr(test, "_volunteer_bounded", False):
            limit = ASYNC_TEST_TIMEOUT
            marker = item.get_closest_marker("trio_timeout")
            if marker and marker.args:
                limit = float(marker.args[0])

            @functools.wraps(test)
            async def bounded(*args, __test=test, __limit=limit, **kwargs):
                with trio.fail_after(__limit):
                    return await __test(*args, **kwargs)

            bounded._volunteer_bounded = True
            item.obj = bounded
