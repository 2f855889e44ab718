"""The HTTP API against its own OpenAPI document: generated requests get no 5xx, and every
response matches the schema, status codes and content types the document declares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from kenning.pipeline.permission import User, issue_key
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """An app over a temporary home with one dataset, and an admin's key."""
    home: Path = tmp_path_factory.mktemp("api-schema")
    # s3:// sources point at a closed local port: unreadable at once, never the network.
    overrides = {"s3_endpoint_url": "http://127.0.0.1:9", "api_max_upload_bytes": 64 * 1024}
    memory = Kenning(load_settings(home=home, embedding_provider="hash", **overrides))
    admin = User(tenant=memory.settings.tenant, name="admin", admin=True)
    memory.wiring.permissions.add_user(admin)
    token, key = issue_key(admin)
    memory.wiring.permissions.add_key(key)
    memory.add_text("Ada Lovelace wrote the first program.", "main")
    memory.cognify("main")
    app = create_app(memory)
    yield app, token
    app.state.kenning.runs.close()
    memory.close()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_api_matches_its_openapi_document(served: tuple[Any, str], mode: GenerationMode) -> None:
    app, token = served
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    schema.config.update(headers={"Authorization": f"Bearer {token}"})
    # A body over the size limit is refused before it is read (413): a rejection like any other.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), "every operation of the document is valid"
    assert len(operations) >= 20
    for operation in operations:
        examine(operation, mode)


def examine(operation: Any, mode: GenerationMode) -> None:
    """A few generated requests of one operation (few: the bound keeps the suite fast)."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=6, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def call(case: Any) -> None:
        checks = CHECKS
        if case.media_type == "multipart/form-data":
            # A form carries every field as text: a number or boolean sent there is a valid string.
            checks = [check for check in CHECKS if check is not negative_data_rejection]
        case.call_and_validate(checks=checks)

    try:
        call()
    except Unsatisfiable:
        # An operation with no input (GET /health) has no invalid variant to send.
        assert mode == GenerationMode.NEGATIVE
