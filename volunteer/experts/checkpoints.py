"""Checkpoint files: atomic, checksummed, two generations, corrupt files moved aside.

A checkpoint file is ``MAGIC`` + the SHA-256 of the rest + a ``torch.save`` payload. Writing
goes to a temporary file (fsync) that replaces ``<uid>.pt`` after the previous checkpoint was
renamed to ``<uid>.pt.prev``: a crash at any point leaves a whole file under one of the names.

Reading checks the checksum before torch parses a byte. A file that fails it (bit rot, a
truncated write, a disk that lied about fsync) is never trained on, never deleted and never
overwritten: it is renamed ``<name>.corrupt-<n>`` (the first unused n), logged in one WARNING
line, and the previous generation is tried; when none is good the expert starts fresh (with a
WARNING). A file that is not a checkpoint at all (no magic) is a configuration mistake and
raises, as does a checkpoint of another expert.

``check_checkpoint_dir`` is what ``volunteer join`` runs at start: an unwritable directory is
found before training, not when the updates are about to be saved at leave time.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
import threading
from pathlib import Path

import torch

from ..errors import CheckpointDirError, ExpertConfigError

log = logging.getLogger(__name__)

MAGIC = b"VOLCKPT1"
_DIGEST = 32  # sha256
HEADER = len(MAGIC) + _DIGEST
PREVIOUS_SUFFIX = ".prev"
_ZIP = b"PK\x03\x04"  # a bare torch.save file, written before checkpoints had a checksum


class CorruptCheckpoint(Exception):
    """Internal: the file failed its checksum or could not be parsed (never leaves this module)."""


class _HashingWriter:
    """File-like for torch.save: hashes what it writes, so the payload is written once."""

    def __init__(self, file) -> None:
        self.file = file
        self.hash = hashlib.sha256()

    def write(self, data) -> int:
        self.hash.update(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def previous_of(path: Path) -> Path:
    """Where the generation before ``path`` lives."""
    return path.with_name(path.name + PREVIOUS_SUFFIX)


def write_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` to ``path`` atomically with its checksum; the file it replaces becomes
    the previous generation. Returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(MAGIC + bytes(_DIGEST))  # the digest is filled in once the payload is out
            writer = _HashingWriter(file)
            # torch.save takes any object with write/flush (its documented "file-like"); the
            # stub narrows that to IO[bytes], which a hashing wrapper would have to fake in full
            torch.save(state, writer)  # type: ignore[arg-type]
            file.seek(len(MAGIC))
            file.write(writer.hash.digest())
            file.flush()
            os.fsync(file.fileno())
        if target.exists():
            os.replace(target, previous_of(target))
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return target


def read_checkpoint(path: str | os.PathLike, *, map_location=None) -> dict:
    """The state in a checkpoint file, checksum verified. Raises CorruptCheckpoint when the
    file is damaged, ExpertConfigError when it is no checkpoint of ours."""
    source = Path(path)
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise ExpertConfigError(f"cannot read checkpoint {source}: {exc}") from exc
    if data.startswith(MAGIC):
        if len(data) < HEADER:
            raise CorruptCheckpoint(f"truncated to {len(data)} bytes")
        payload = memoryview(data)[HEADER:]
        if hashlib.sha256(payload).digest() != data[len(MAGIC) : HEADER]:
            raise CorruptCheckpoint(f"checksum mismatch over {len(payload)} payload bytes")
    elif MAGIC.startswith(data):
        raise CorruptCheckpoint(f"truncated to {len(data)} bytes")
    elif data.startswith(_ZIP):
        payload = memoryview(data)  # before checksums: loaded as it is, re-saved with one
        log.info("checkpoint %s has no checksum (an older format); it gets one at the next save", source)
    else:
        raise ExpertConfigError(f"cannot read checkpoint {source}: not a volunteer expert checkpoint")
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for damaged archives
        raise CorruptCheckpoint(f"unreadable: {type(exc).__name__}: {str(exc)[:200]}") from None
    return state


def move_aside(path: Path) -> Path:
    """Rename ``path`` to ``<name>.corrupt-<n>`` with the first n not taken; never overwrites."""
    n = 1
    while True:
        aside = path.with_name(f"{path.name}.corrupt-{n}")
        try:
            os.link(path, aside)  # fails if ``aside`` exists: no check-then-rename race
        except FileExistsError:
            n += 1
            continue
        except OSError:  # a filesystem without hard links
            if aside.exists():
                n += 1
                continue
            os.rename(path, aside)
            return aside
        path.unlink()
        return aside


def load_latest(path: str | os.PathLike, *, map_location=None) -> dict | None:
    """The state of the newest good generation of ``path`` (None when there is none). Corrupt
    generations are moved aside, one WARNING line each."""
    current = Path(path)
    generations = [current, previous_of(current)]
    for index, candidate in enumerate(generations):
        if not candidate.exists():
            continue
        try:
            return read_checkpoint(candidate, map_location=map_location)
        except CorruptCheckpoint as exc:
            aside = move_aside(candidate)
            rest = [g for g in generations[index + 1 :] if g.exists()]
            then = f"resuming from the previous generation {rest[0].name}" if rest else "starting this expert fresh"
            log.warning("checkpoint %s is corrupt (%s): moved to %s, %s", candidate, exc, aside.name, then)
    return None


def check_checkpoint_dir(directory: str | os.PathLike) -> Path:
    """Create ``directory`` if needed and prove a file can be written, synced and removed there;
    CheckpointDirError (one line) otherwise."""
    path = Path(directory).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-", delete=True) as probe:
            probe.write(b"volunteer")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CheckpointDirError(f"checkpoint directory {path} is not writable: {reason}") from None
    return path


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets us open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["MAGIC", "check_checkpoint_dir", "load_latest", "move_aside", "previous_of", "read_checkpoint", "write_checkpoint"]
