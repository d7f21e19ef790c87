"""structured_outputs: the answer must be a JSON document that fits the row's JSON schema.

Each row carries a schema (`schema_str`); the prompt asks for JSON that fits it. `verify` parses the model's whole
text as JSON and validates it with `openapi-schema-validator` (OpenAPI 3.1 schema objects, i.e. JSON Schema
2020-12 plus OpenAPI's keywords).

Before validating, the schema is made *strict*, the way OpenAI's strict structured outputs work: every object that
lists `properties` requires all of them and allows no others. So a schema written loosely still demands exactly
the declared keys.

What it teaches: using a real validation library in a verifier, never letting a model's bad output raise (every
failure is reward 0.0 with the reason in `error_type` / `error_message`), and returning diagnostics next to the
reward.
"""

import json
from typing import Any, Literal, Optional

from fastapi import FastAPI
from jsonschema.exceptions import SchemaError, ValidationError
from openapi_schema_validator import OAS31Validator, validate

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class StructuredOutputsResourcesServerConfig(BaseResourcesServerConfig):
    pass


class StructuredOutputsRunRequest(BaseRunRequest):
    schema_str: str  # the JSON schema, as JSON text
    schema_type: Literal["json"] = "json"  # the format of the answer; only JSON for now


class StructuredOutputsVerifyRequest(StructuredOutputsRunRequest, BaseVerifyRequest):
    pass


ErrorType = Literal["schema_error", "parse_error", "validation_error"]


class StructuredOutputsVerifyResponse(StructuredOutputsVerifyRequest, BaseVerifyResponse):
    # Why the reward is 0 (both None on success). schema_error = the row's schema is broken, not the model's fault.
    error_type: Optional[ErrorType] = None
    error_message: Optional[str] = None


# ------------------------------------------------------------------------------------------------ strictify

# Where a JSON schema holds subschemas: a single schema, a list of schemas, or a name -> schema map. Only these
# are walked, so values such as `default`, `examples`, `const` or `enum`, and property *names*, are never touched.
_SUBSCHEMA = (
    "additionalProperties",
    "items",  # a schema, or a list of schemas in the older tuple form
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SUBSCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAP = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")


def strictify_schema(schema: Any) -> None:
    """In place: every object schema with `properties` gets `required` = all of them and
    `additionalProperties: false`, at every depth (including inside `anyOf`, `items`, `$defs`, ...)."""
    if not isinstance(schema, dict):
        return  # `true` / `false` schemas, or junk that the validator will reject
    properties = schema.get("properties")
    if isinstance(properties, dict):
        schema["required"] = list(properties)
        schema["additionalProperties"] = False
    for key in _SUBSCHEMA:
        value = schema.get(key)
        for subschema in value if isinstance(value, list) else [value]:
            strictify_schema(subschema)
    for key in _SUBSCHEMA_LIST:
        value = schema.get(key)
        if isinstance(value, list):
            for subschema in value:
                strictify_schema(subschema)
    for key in _SUBSCHEMA_MAP:
        value = schema.get(key)
        if isinstance(value, dict):
            for subschema in value.values():
                strictify_schema(subschema)


# ------------------------------------------------------------------------------------------------ verify


def response_text(body: BaseVerifyRequest) -> str:
    """All `output_text` parts of the assistant messages, concatenated as they are (no separator)."""
    return body.response.output_text


def _reject_non_json_constant(name: str) -> Any:
    # Python's json module accepts NaN and Infinity; JSON does not.
    raise ValueError(f"{name} is not valid JSON")


def _short(error: Exception) -> str:
    text = f"{type(error).__name__}: {getattr(error, 'message', None) or error}"
    return text if len(text) <= 500 else text[:500] + "..."


def check_answer(schema_str: str, text: str) -> tuple[float, Optional[ErrorType], Optional[str]]:
    """(reward, error_type, error_message) for one answer."""
    try:
        schema = json.loads(schema_str)
        strictify_schema(schema)
        OAS31Validator.check_schema(schema)
    except (ValueError, RecursionError, SchemaError) as error:
        return 0.0, "schema_error", _short(error)

    try:
        # The whole text must be the JSON document: no prose around it, no Markdown code fence.
        answer = json.loads(text, parse_constant=_reject_non_json_constant)
    except (ValueError, RecursionError) as error:
        return 0.0, "parse_error", _short(error)

    try:
        validate(answer, schema, cls=OAS31Validator, check_schema=False)
    except (ValidationError, RecursionError) as error:
        return 0.0, "validation_error", _short(error)
    return 1.0, None, None


class StructuredOutputsResourcesServer(SimpleResourcesServer):
    config: StructuredOutputsResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the answer is in the text

    async def verify(self, body: StructuredOutputsVerifyRequest) -> StructuredOutputsVerifyResponse:
        reward, error_type, error_message = check_answer(body.schema_str, response_text(body))
        return StructuredOutputsVerifyResponse(
            **body.model_dump(), reward=reward, error_type=error_type, error_message=error_message
        )


if __name__ == "__main__":
    StructuredOutputsResourcesServer.run_webserver()
