"""Property-based API tests generated from the app's own OpenAPI schema.

Every operation gets schema-valid and schema-invalid requests (schemathesis'
positive and negative modes).  Whatever comes in: no 5xx, every 4xx in the
one error shape, responses that match the schema, invalid data rejected.
The engine runs in paranoid mode (pool invariants after every operation) and
``engine.check()`` runs at the end.

Not fuzzed: POST /api/demo/start (the workload would churn the pool in the
background for the rest of the run; tests/app/test_demo.py covers it).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.app.conftest import ERROR_KEYS, make_app

# A modest pool, small limits so that generated data can reach them.
APP = make_app(
    num_blocks=256,
    block_size=4,
    num_groups=2,
    max_ids_per_call=512,
    max_tokens_per_request=4096,
    max_batch_ops=64,
    max_requests=200,
    event_log_capacity=1000,
    metrics_sample_rate=1.0,
    allowed_hosts=["testserver"],  # schemathesis' ASGI client's Host
)
MAX_EXAMPLES = 60
MIN_REQUESTS = 1000

schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(
    path="/api/demo/start", method="POST"
)
SENT: Counter[str] = Counter()
STATUSES: Counter[int] = Counter()


@schemathesis.check
def error_shape(ctx: Any, response: Any, case: Any) -> bool | None:  # noqa: ARG001 schemathesis' check signature
    """Every 4xx/5xx answers {"error": {status, code, message, details}}."""
    if response.status_code < 400:
        return None
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == ERROR_KEYS, err
    assert err["status"] == response.status_code, err
    assert isinstance(err["code"], str) and err["code"], err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["details"], dict), err
    return None


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_from_schema(case: schemathesis.Case) -> None:
    # The default checks (not_a_server_error, status code / content type /
    # schema conformance, negative_data_rejection, unsupported_method, ...)
    # plus the error shape.
    response = case.call_and_validate(
        # Valid-looking data may still be refused by the pool's state (409,
        # 404 for an unknown request): that is not a failure here.
        excluded_checks=[positive_data_acceptance],
        additional_checks=[error_shape],
    )
    SENT[f"{case.operation.method.upper()} {case.operation.path}"] += 1
    STATUSES[response.status_code] += 1
    assert response.status_code < 500


def check_volume_and_engine_state(every_operation_selected: bool) -> None:
    """After the generated tests: no 5xx, the engine's bookkeeping still
    holds, and -- when every operation's test was selected -- enough
    requests reached every operation."""
    total = sum(SENT.values())
    print(f"schemathesis: {total} requests, statuses {dict(sorted(STATUSES.items()))}")  # noqa: T201 the run's report
    assert not [s for s in STATUSES if s >= 500]
    engine = APP.state.engine
    engine.check()
    assert engine.counters.ops > 0
    if every_operation_selected:
        assert total >= MIN_REQUESTS, SENT
        assert len(SENT) == len(list(schema.get_all_operations()))


@pytest.fixture(scope="module", autouse=True)
def _after_the_generated_tests(request: pytest.FixtureRequest) -> Any:
    """Runs once the module's tests are done, whatever their order or the
    selection (a test of its own would depend on running last)."""
    yield
    try:
        if SENT:
            selected = [
                item
                for item in request.session.items
                if item.module is request.module and item.originalname == "test_api_from_schema"
            ]
            check_volume_and_engine_state(len(selected) == len(list(schema.get_all_operations())))
    finally:
        from schemathesis.python.asgi import shutdown_lifespans

        shutdown_lifespans()
