"""Checkpoints: checksummed, two generations, corrupt files moved aside (never deleted nor
overwritten) with one WARNING line, and an unwritable directory found at start."""

from __future__ import annotations

import logging
import os
import stat

import pytest
import torch

from volunteer.errors import CheckpointDirError, ExpertConfigError
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.checkpoints import HEADER, check_checkpoint_dir, load_latest, read_checkpoint, write_checkpoint

CONFIG = ExpertsConfig(checkpoint_every=0)


def _train(backend, steps: int) -> None:
    for _ in range(steps):
        backend.backward([torch.randn(4, 8)], [torch.randn(4, 8)])


def _two_generations(tmp_path):
    """A backend saved at 1 update (now the previous generation) and at 3 (the current one)."""
    backend = make_backend("ffn.1", "ffn", 8, config=CONFIG, checkpoint_dir=tmp_path)
    _train(backend, 1)
    backend.save_checkpoint()
    previous = {k: v.clone() for k, v in backend.module.state_dict().items()}
    _train(backend, 2)
    backend.save_checkpoint()
    return tmp_path / "ffn.1.pt", previous


def _corrupt_middle(path, nbytes: int = 64) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + nbytes] = bytes(b ^ 0xFF for b in data[middle : middle + nbytes])
    path.write_bytes(bytes(data))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("damage", ["corrupted", "truncated"])
def test_a_damaged_checkpoint_is_moved_aside_and_the_previous_generation_resumes(tmp_path, caplog, damage):
    path, previous = _two_generations(tmp_path)
    original = path.read_bytes()
    if damage == "corrupted":
        _corrupt_middle(path)
    else:
        path.write_bytes(original[: len(original) // 2])
    damaged = path.read_bytes()
    with caplog.at_level(logging.WARNING):
        restarted = make_backend("ffn.1", "ffn", 8, config=CONFIG, checkpoint_dir=tmp_path)
    assert restarted.updates == 1  # the previous generation, not the damaged weights
    assert all(torch.equal(previous[k], v) for k, v in restarted.module.state_dict().items())
    aside = tmp_path / "ffn.1.pt.corrupt-1"
    assert aside.read_bytes() == damaged  # kept, byte for byte
    assert not path.exists()
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "ffn.1.pt.corrupt-1" in warnings[0] and "previous generation" in warnings[0]

    # the next save makes a new current generation; the corrupt file stays untouched
    _train(restarted, 1)
    restarted.save_checkpoint()
    assert read_checkpoint(path)["updates"] == 2 and aside.read_bytes() == damaged


def test_corrupt_files_are_never_overwritten_and_both_generations_bad_start_fresh(tmp_path, caplog):
    path, _ = _two_generations(tmp_path)
    (tmp_path / "ffn.1.pt.corrupt-1").write_bytes(b"an earlier corrupt file")
    _corrupt_middle(path)
    _corrupt_middle(tmp_path / "ffn.1.pt.prev")
    with caplog.at_level(logging.WARNING):
        restarted = make_backend("ffn.1", "ffn", 8, config=CONFIG, checkpoint_dir=tmp_path)
    assert restarted.updates == 0  # fresh
    assert (tmp_path / "ffn.1.pt.corrupt-1").read_bytes() == b"an earlier corrupt file"
    assert {p.name for p in tmp_path.iterdir()} == {"ffn.1.pt.corrupt-1", "ffn.1.pt.corrupt-2", "ffn.1.pt.prev.corrupt-1"}
    warnings = _warnings(caplog)
    assert len(warnings) == 2 and "starting this expert fresh" in warnings[1]


def test_a_crash_between_the_renames_resumes_from_the_previous_generation(tmp_path):
    path, _ = _two_generations(tmp_path)
    path.unlink()  # what a crash after "current → previous" and before "new → current" leaves
    assert make_backend("ffn.1", "ffn", 8, config=CONFIG, checkpoint_dir=tmp_path).updates == 1


def test_header_layout_and_legacy_files(tmp_path):
    state = {"format": 1, "x": torch.arange(4)}
    path = write_checkpoint(tmp_path / "a.pt", state)
    assert path.read_bytes()[:8] == b"VOLCKPT1" and path.stat().st_size > HEADER
    assert torch.equal(read_checkpoint(path)["x"], state["x"])
    torch.save(state, tmp_path / "legacy.pt")  # written before checksums: still loads
    assert torch.equal(load_latest(tmp_path / "legacy.pt")["x"], state["x"])
    (tmp_path / "foreign.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ExpertConfigError, match="not a volunteer expert checkpoint"):
        load_latest(tmp_path / "foreign.pt")


def test_check_checkpoint_dir_creates_writes_and_refuses_in_one_line(tmp_path):
    assert check_checkpoint_dir(tmp_path / "new" / "dir") == tmp_path / "new" / "dir"
    assert list((tmp_path / "new" / "dir").iterdir()) == []  # the probe is gone
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(locked, os.W_OK):  # root ignores permissions: a file in the way does not
            locked = tmp_path / "a-file"
            locked.write_bytes(b"")
        with pytest.raises(CheckpointDirError) as caught:
            check_checkpoint_dir(locked / "sub" if locked.is_file() else locked)
        assert "\n" not in str(caught.value) and "not writable" in str(caught.value)
    finally:
        (tmp_path / "locked").chmod(stat.S_IRWXU)


def test_a_leftover_checkpoint_of_another_expert_names_the_file_and_the_way_out(tmp_path):
    config = ExpertsConfig(device="cpu")
    make_backend("e.0", "ffn", 8, config=config, checkpoint_dir=tmp_path).save_checkpoint()
    with pytest.raises(ExpertConfigError) as refused:
        make_backend("e.0", "ffn", 16, config=config, checkpoint_dir=tmp_path)
    text = str(refused.value)
    assert text.startswith(f"checkpoint {tmp_path / 'e.0.pt'} does not fit expert 'e.0' (checkpoint has hidden_dim 8, this expert 16)")
    assert "move that file aside" in text and "--checkpoints DIR" in text and "\n" not in text
