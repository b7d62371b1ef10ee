"""Error replies: server exception → msgpack-able dict → typed client exception."""

from __future__ import annotations

import traceback

import os

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import (
    ExpertBackwardRefusedError,
    ExpertBusyError,
    ExpertInputError,
    ExpertPausedError,
    ExpertProtocolError,
    ExpertUnavailableError,
    RemoteExpertError,
    UnknownExpertError,
)
from volunteer.experts.config import ExpertsConfig
from volunteer.experts.failures import KEYS, check_failure, from_failure, raise_remote, redact_path, to_failure


def _expert_code_that_fails():
    raise ZeroDivisionError("division by zero in the expert")


def _caught(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the point is to capture it
        return exc
    raise AssertionError("did not raise")


def test_round_trip_carries_type_message_and_traceback():
    exc = _caught(_expert_code_that_fails)
    data = msgpack.unpackb(msgpack.packb(to_failure(exc, expert_uid="ffn.1.2", peer_id="12D3KooWpeer")))
    assert set(data) == KEYS and data["kind"] == "error" and data["type"] == "ZeroDivisionError"
    with pytest.raises(RemoteExpertError) as info:
        raise_remote(data)
    err = info.value
    assert err.error_type == "ZeroDivisionError" and err.remote_message == "division by zero in the expert"
    assert err.expert_uid == "ffn.1.2" and err.peer_id == "12D3KooWpeer"
    assert "_expert_code_that_fails" in err.remote_traceback
    # str() is one line; the remote traceback shows where a traceback is printed
    assert "\n" not in str(err) and str(err).startswith("ZeroDivisionError: division by zero in the expert")
    printed = "".join(traceback.format_exception(err))
    assert "Remote traceback" in printed and "_expert_code_that_fails" in printed


def test_client_overrides_who_it_called():
    data = to_failure(RuntimeError("x"), expert_uid="claimed", peer_id="liar")
    err = from_failure(data, expert_uid="ffn.0", peer_id="real")
    assert isinstance(err, RemoteExpertError) and (err.expert_uid, err.peer_id) == ("ffn.0", "real")


def test_volunteer_types_are_qualified_and_input_errors_are_tagged():
    data = to_failure(ExpertInputError("input 0: got float64[2, 3]"), expert_uid="e.0")
    assert data["type"] == "volunteer.errors.ExpertInputError" and data["kind"] == "input"
    err = from_failure(data)
    assert isinstance(err, RemoteExpertError) and "float64" in str(err)


@pytest.mark.parametrize(
    "exc,kind,cls",
    [
        (ExpertBusyError("queue full"), "busy", ExpertBusyError),
        (ExpertPausedError("paused"), "paused", ExpertPausedError),
        (UnknownExpertError("no such expert"), "unknown", UnknownExpertError),
    ],
)
def test_refusals_become_unavailable_errors_without_traceback(exc, kind, cls):
    data = to_failure(_caught(lambda: (_ for _ in ()).throw(exc)), expert_uid="ffn.3", peer_id="p")
    assert data["kind"] == kind and data["traceback"] == ""
    err = from_failure(data)
    assert type(err) is cls and isinstance(err, ExpertUnavailableError) and "ffn.3" in str(err)


def test_long_fields_are_clipped_to_the_limits():
    config = ExpertsConfig(max_error_message=100, max_error_traceback=200, max_error_field=20)
    exc = _caught(lambda: (_ for _ in ()).throw(ValueError("m" * 1000)))
    data = to_failure(exc, expert_uid="u" * 50, peer_id="p" * 50, config=config)
    assert len(data["message"]) == 100 and len(data["expert_uid"]) == 20
    assert len(data["traceback"]) <= 200 and data["traceback"].rstrip().endswith("m" * 10)  # the tail is kept
    check_failure(data, config=config)
    with pytest.raises(ExpertProtocolError):
        check_failure(dict(data, message="m" * 101), config=config)


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"type": "X"},
        dict(to_failure(ValueError("v")), kind="weird"),
        dict(to_failure(ValueError("v")), message=5),
        dict(to_failure(ValueError("v")), extra=""),
    ],
)
def test_malformed_replies_are_protocol_errors(data):
    with pytest.raises(ExpertProtocolError):
        raise_remote(data)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.dictionaries(st.sampled_from(sorted(KEYS) + ["x"]), st.one_of(st.text(max_size=30), st.integers(), st.none()), max_size=8),
        st.lists(st.text(max_size=3), max_size=3),
        st.text(max_size=5),
    )
)
def test_random_replies_only_raise_typed_errors(data):
    try:
        err = from_failure(data)
    except ExpertProtocolError:
        return
    assert isinstance(err, (RemoteExpertError, ExpertUnavailableError))


def test_an_exception_whose_str_fails_still_serializes():
    class Nasty(Exception):
        def __str__(self):
            raise RuntimeError("no")

    data = to_failure(Nasty())
    assert "str() failed" in data["message"] and data["type"].endswith("Nasty")


# --- traceback privacy (ExpertsConfig.share_tracebacks) ---------------------------------------


def _failure_from_the_package() -> BaseException:
    from volunteer.experts.tensors import deserialize

    def from_user_code():
        try:
            deserialize({"t": "nope", "n": 1}, b"")
        except Exception as exc:
            raise RuntimeError("the custom expert gave up") from exc

    return _caught(from_user_code)


def test_redacted_is_the_default_and_shows_no_absolute_paths():
    assert ExpertsConfig().share_tracebacks == "redacted"
    failure = to_failure(_failure_from_the_package())
    trace = failure["traceback"]
    assert 'File "volunteer/experts/tensors.py"' in trace  # relative to the package's root
    assert "from_user_code" in trace and "RuntimeError: the custom expert gave up" in trace
    assert "TensorFormatError" in trace  # the chained cause keeps its frames too
    assert __file__ not in trace and os.path.expanduser("~") + "/" not in trace
    assert not any(line.strip().startswith('File "/') for line in trace.splitlines())
    assert failure["message"] == "the custom expert gave up"


def test_full_shares_absolute_paths():
    failure = to_failure(_failure_from_the_package(), config=ExpertsConfig(share_tracebacks="full"))
    assert __file__ in failure["traceback"]


def test_none_shares_type_and_message_only():
    failure = to_failure(_failure_from_the_package(), config=ExpertsConfig(share_tracebacks="none"))
    assert failure["traceback"] == ""
    err = from_failure(failure)
    assert isinstance(err, RemoteExpertError) and err.remote_traceback == ""
    assert err.error_type == "RuntimeError" and "the custom expert gave up" in str(err)


def test_paths_outside_the_package_show_relative_to_home_or_by_name():
    home = os.path.expanduser("~")
    assert redact_path(os.path.join(home, "experts", "mine.py")) == "~/experts/mine.py"
    assert redact_path("/nowhere/known/secret_layout/mine.py") == "mine.py"
    assert redact_path("<string>") == "<string>"
    assert redact_path(os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "linear.py")) == "torch/nn/modules/linear.py"


def test_a_backward_refusal_crosses_the_wire_as_its_own_type():
    failure = to_failure(ExpertBackwardRefusedError("no forward from you"), expert_uid="ffn.1", peer_id="QmServer")
    assert failure["kind"] == "refused" and failure["traceback"] == ""
    err = from_failure(failure)
    assert type(err) is ExpertBackwardRefusedError and isinstance(err, ExpertUnavailableError) and "ffn.1" in str(err)
