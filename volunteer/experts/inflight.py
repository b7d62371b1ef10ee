"""``InFlight``: how many calls a service is serving, and an event for when it serves none (a
leaving node pauses the runtime, then waits until its expert services are idle)."""

from __future__ import annotations

import trio


class InFlight:
    """A count of calls being served; ``wait_idle`` returns once it is zero."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = trio.Event()
        self._idle.set()

    def started(self) -> None:
        """A call began."""
        if not self.count:
            self._idle = trio.Event()
        self.count += 1

    def ended(self) -> None:
        """A call ended (answered, failed or cancelled)."""
        self.count -= 1
        if not self.count:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no call is being served (at once when none is)."""
        while self.count:
            await self._idle.wait()


__all__ = ["InFlight"]
