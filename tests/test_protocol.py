"""The coordinator <-> worker contract (distfusion.protocol): pure data, no runtime."""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest

from distfusion import (
    AuthenticationError,
    PlanningError,
    QueryCancelled,
    TaskError,
    TransportError,
    WorkerUnavailableError,
)
from distfusion.protocol import TaskKey, error_from_dict, error_to_dict, hash_type, task_error
from distfusion.protocol.errors import KIND
from distfusion.protocol.messages import (
    decode_task_request,
    decode_ticket,
    encode_task_request,
    encode_ticket,
)

ERRORS = [
    TaskError(3, 1, "grpc://127.0.0.1:50051", "Exception: DataFusion error: boom", "Traceback ..."),
    WorkerUnavailableError("grpc://h:1", "reading partition 0"),
    AuthenticationError("grpc://h:1", "missing or wrong token"),
    TransportError("worker grpc://h:1 answered badly"),
    QueryCancelled("query 1a2b was cancelled"),
    PlanningError("table 'x' not found"),
]


@pytest.mark.parametrize("err", ERRORS, ids=[type(e).__name__ for e in ERRORS])
def test_errors_keep_kind_message_and_fields_through_the_codec_and_pickle(err):
    wire = json.loads(json.dumps(error_to_dict(err)))
    assert wire[KIND] == type(err).__name__
    for back in (error_from_dict(wire), pickle.loads(pickle.dumps(err))):
        assert type(back) is type(err)
        assert str(back) == str(err)
        assert all(getattr(back, f) == getattr(err, f) for f in err.error_fields)


def test_a_foreign_error_travels_with_its_traceback_and_is_not_decoded():
    try:
        raise TimeoutError("no answer")
    except TimeoutError as exc:
        wire = error_to_dict(exc)
    assert wire[KIND] == "TimeoutError" and "Traceback" in wire["remote_traceback"]
    assert error_from_dict(wire) is None
    assert error_from_dict({"message": "no kind"}) is None
    assert error_from_dict({KIND: "TaskError", "stage_id": 1}) is None  # fields missing


def test_task_error_names_the_task_and_keeps_the_cause_and_traceback():
    try:
        raise ValueError("bad row")
    except ValueError as exc:
        err = task_error(2, 0, "local://1", exc)
    assert (err.stage_id, err.task_index, err.worker) == (2, 0, "local://1")
    assert err.cause == "ValueError: bad row" and "Traceback" in err.remote_traceback
    assert str(err) == "stage 2 task 0 failed on worker local://1: ValueError: bad row"


def test_ticket_and_task_request_round_trip():
    key = TaskKey("q" * 32, 4, 2)
    assert decode_ticket(encode_ticket(key, 3, 0.5)) == (key, 3, 0.5)
    assert decode_ticket(encode_ticket(key, 0, None)) == (key, 0, None)
    assert decode_task_request(encode_task_request(key, 1.0)) == (key, 1.0)
    with pytest.raises(ValueError, match="not a distfusion ticket"):
        decode_ticket(b'{"query_id": "q"}')


def test_hash_type_unifies_integers_and_strings():
    assert {hash_type(t) for t in (pa.int8(), pa.int32(), pa.uint16(), pa.int64())} == {pa.int64()}
    assert {hash_type(t) for t in (pa.string(), pa.large_string(), pa.string_view())} == {
        pa.string()
    }
    assert hash_type(pa.float64()) == pa.float64()
