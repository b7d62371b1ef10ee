"""A testnet that fails to start says why in its error, not by a path to a temporary directory
it removes as it stops; its volunteers keep their state in the testnet's directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from volunteer.cli import testnet
from volunteer.errors import VolunteerError

def volunteer_error(exc: BaseException) -> VolunteerError:
    """The VolunteerError a start failed with (trio's nursery wraps it in a group; the CLI
    prints the leaf in one line)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, VolunteerError), exc
    return exc


BROKEN = "print('relay: cannot bind the port (a stand-in failure)'); raise SystemExit(3)"


async def test_a_relay_that_exits_early_is_shown_by_its_log_not_by_a_removed_path(monkeypatch, tmp_path):
    monkeypatch.setattr(testnet, "_python", lambda: [sys.executable, "-c", BROKEN])
    monkeypatch.delenv("VOLUNTEER_KEEP_TESTNET", raising=False)
    monkeypatch.setattr(testnet.tempfile, "tempdir", str(tmp_path))  # where its temporary directory goes
    with pytest.raises(BaseException) as raised:
        async with testnet.open_testnet(1, None):
            pass
    message = str(volunteer_error(raised.value))
    assert "cannot bind the port (a stand-in failure)" in message and "--dir DIR" in message
    assert list(tmp_path.iterdir()) == []  # the directory (and its keys) went
    named = [word for word in message.split() if word.startswith(str(tmp_path))]
    assert all(Path(word).exists() for word in named), named  # no path to what is gone


async def test_a_kept_directory_is_named_in_the_error(monkeypatch, tmp_path):
    monkeypatch.setattr(testnet, "_python", lambda: [sys.executable, "-c", BROKEN])
    with pytest.raises(BaseException) as raised:
        async with testnet.open_testnet(1, None, workdir=tmp_path / "net"):
            pass
    assert f"see {tmp_path / 'net' / 'relay.log'}" in str(volunteer_error(raised.value))
    assert (tmp_path / "net" / "relay.log").exists()
