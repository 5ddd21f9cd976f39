"""Bad pull requests get the same answer with raw_records as without: the same status and details
(every bound is checked before the answer's form matters)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from hypothesis import given

from tests.query.query_process import System
from tests.query.test_bad_input import FUZZ, pull_requests


@FUZZ
@given(request=pull_requests())
def test_bad_pulls_fail_alike_in_both_modes(system: System, request: Any) -> None:
    failures = []
    for raw in (False, True):
        request.raw_records = raw
        with pytest.raises(grpc.RpcError) as info:
            system.query.stub.PullMessage(request, timeout=5)
        failures.append((info.value.code(), info.value.details()))
    assert failures[0] == failures[1] and failures[0][0] == grpc.StatusCode.INVALID_ARGUMENT, failures
