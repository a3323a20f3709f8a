"""Schemathesis fuzz of the OpenAPI schema: whatever it sends, the server never answers 5xx.

Both schema-valid (positive) and schema-violating (negative) requests are generated for every
operation, a bounded number of each, derandomized so the run is reproducible.
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, not_a_server_error,
                                 response_schema_conformance)

from retriever_server.api.app import create_app

pytestmark = pytest.mark.stress  # hundreds of generated requests: seconds, in-process

EXAMPLES = 40
# Schema-valid requests may still be refused (top_n over the limit, query/id length mismatch),
# so positive_data_acceptance does not apply; these must always hold.
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def operations(sample_index):
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(sample_index))
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/batch_search", "/batch_fetch", "/search", "/health",
                                       "/documents"}
    return ops


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(operations, mode):
    calls = []
    for op in operations:
        if mode is GenerationMode.NEGATIVE and op.method.upper() == "GET":
            continue  # nothing to violate: the GET routes take no input

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case):
            response = case.call_and_validate(checks=CHECKS)
            calls.append(response.status_code)

        fuzz()
    assert calls and all(code < 500 for code in calls)
