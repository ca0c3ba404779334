"""The runner API as an OpenAPI 3.1 document, generated from ``runnerapi_models.ENDPOINTS``.

Checked in as ``schema/runner-api.openapi.json``; a test keeps it equal to this output.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from looprelay.wire.runner_api import API_PREFIX, ENDPOINTS, ErrorAnswer

_REF_TEMPLATE = "#/components/schemas/{model}"
_ERROR_TEXT = {
    400: "The body is malformed; the message names the field.",
    401: "Unknown runner, wrong secret, revoked runner or bad token (a session token of "
    "another session, or of one ended or respawned since).",
    404: "No such dispatch or session, or this server posts nothing on GitHub.",
    409: "The lease passed to another runner; this result no longer counts.",
    413: "The body is larger than the API accepts.",
    502: "GitHub refused the comment; the message says why.",
    503: "The store is unavailable; retry with backoff.",
}


def runner_api_document(version: str = "1") -> dict[str, Any]:
    """Return the OpenAPI document of ``/runner/v1/...``."""
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for name, endpoint in ENDPOINTS.items():
        responses: dict[str, Any] = {}
        for status, model in endpoint.answers.items():
            responses[str(status)] = (
                {"description": "Nothing came within the wait."}
                if model is None
                else _json_response(model.__doc__ or model.__name__, _ref(model, schemas))
            )
        for status in endpoint.errors:
            responses[str(status)] = _json_response(_ERROR_TEXT[status], _ref(ErrorAnswer, schemas))
        operation: dict[str, Any] = {
            "operationId": name,
            "summary": endpoint.summary,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(endpoint.body, schemas)}},
            },
            "responses": responses,
        }
        operation["security"] = [{endpoint.security: []}] if endpoint.security else []
        paths[f"{API_PREFIX}{name}"] = {"post": operation}
    return {
        "openapi": "3.1.0",
        "info": {"title": "looprelay runner API", "version": version},
        "paths": paths,
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {
                "runnerSecret": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`<runner_id>:<secret>` from registration.",
                },
                "sessionToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A session's token, from the environment its runner "
                    "started it with (`LOOPRELAY_SESSION_TOKEN`).",
                },
            },
        },
    }


def runner_api_document_text() -> str:
    """Return the document as the exact text checked in under ``schema/``."""
    return json.dumps(runner_api_document(), indent=2, sort_keys=True) + "\n"


def _json_response(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": description.strip().splitlines()[0],
        "content": {"application/json": {"schema": schema}},
    }


def _ref(model: type[BaseModel], schemas: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=_REF_TEMPLATE)
    for nested_name, nested in schema.pop("$defs", {}).items():
        schemas[nested_name] = nested
    schemas[model.__name__] = schema
    return {"$ref": _REF_TEMPLATE.format(model=model.__name__)}
