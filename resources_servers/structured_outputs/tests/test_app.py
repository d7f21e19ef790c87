import json

import pytest
from fastapi.testclient import TestClient
from openapi_schema_validator import OAS31Validator
from pydantic import ValidationError

from nemo_gym.testing.responses import function_call, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.structured_outputs.app import (
    StructuredOutputsResourcesServer,
    StructuredOutputsVerifyRequest,
    strictify_schema,
)

PARAMS = {"input": [{"role": "user", "content": "Describe a person as JSON."}]}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PERSON = {"name": "Ada", "age": 41, "address": {"city": "Lyon"}}


def new_server() -> StructuredOutputsResourcesServer:
    return make_server(StructuredOutputsResourcesServer, name="structured_outputs", domain="instruction_following")


VERIFY = Verifier(new_server, StructuredOutputsVerifyRequest, PARAMS)


def verify(*output, schema=PERSON_SCHEMA, schema_str=None):
    return VERIFY(*output, schema_str=schema_str if schema_str is not None else json.dumps(schema))


# ----------------------------------------------------------------------------------------------- strictify


def test_strictify_requires_every_property_and_forbids_others_at_every_depth():
    schema = json.loads(json.dumps(PERSON_SCHEMA))
    strictify_schema(schema)
    assert schema["required"] == ["name", "age", "address"]
    assert schema["additionalProperties"] is False
    address = schema["properties"]["address"]
    assert address["required"] == ["city"] and address["additionalProperties"] is False
    assert "required" not in schema["properties"]["name"]  # no properties: untouched


def test_strictify_walks_combinators_arrays_and_definitions():
    obj = {"type": "object", "properties": {"x": {"type": "integer"}}}
    schema = {
        "anyOf": [json.loads(json.dumps(obj)), {"type": "null"}],
        "items": json.loads(json.dumps(obj)),
        "prefixItems": [json.loads(json.dumps(obj))],
        "$defs": {"thing": json.loads(json.dumps(obj))},
        "definitions": {"old": json.loads(json.dumps(obj))},
        "additionalProperties": {"type": "object", "properties": {"y": {"type": "string"}}},
        "not": json.loads(json.dumps(obj)),
    }
    strictify_schema(schema)
    for node in (
        schema["anyOf"][0],
        schema["items"],
        schema["prefixItems"][0],
        schema["$defs"]["thing"],
        schema["definitions"]["old"],
        schema["additionalProperties"],
        schema["not"],
    ):
        assert node["required"] == list(node["properties"]) and node["additionalProperties"] is False
    assert schema["anyOf"][1] == {"type": "null"}


def test_strictify_leaves_property_names_and_data_values_alone():
    schema = {
        "type": "object",
        "properties": {"properties": {"type": "string"}, "items": {"type": "integer"}},
        "default": {"properties": {"a": 1}},
        "examples": [{"properties": {"b": 2}}],
    }
    strictify_schema(schema)
    assert schema["properties"] == {"properties": {"type": "string"}, "items": {"type": "integer"}}
    assert schema["required"] == ["properties", "items"]
    assert schema["default"] == {"properties": {"a": 1}}
    assert schema["examples"] == [{"properties": {"b": 2}}]


def test_strictify_ignores_boolean_and_malformed_nodes():
    schema = {"items": True, "anyOf": "not a list", "properties": "not a dict"}
    strictify_schema(schema)
    assert schema == {"items": True, "anyOf": "not a list", "properties": "not a dict"}
    strictify_schema(True)  # no error


# ----------------------------------------------------------------------------------------------- verify


def test_valid_answer_gets_reward_one():
    result = verify(json.dumps(PERSON))
    assert result.reward == 1.0
    assert result.error_type is None and result.error_message is None
    assert json.loads(result.schema_str) == PERSON_SCHEMA and result.schema_type == "json"  # echoed


def test_text_is_concatenated_across_parts_and_messages():
    text = json.dumps(PERSON)
    result = verify(reasoning("{oops"), message(text[:10], text[10:20], msg_id="m1"), message(text[20:], msg_id="m2"))
    assert result.reward == 1.0


@pytest.mark.parametrize(
    "answer, field",
    [
        ({"name": "Ada", "age": 41}, "address"),  # missing property (required by strictification)
        ({**PERSON, "email": "a@b.c"}, "email"),  # extra property
        ({**PERSON, "address": {"city": "Lyon", "zip": "69000"}}, "zip"),  # extra property, nested
        ({**PERSON, "age": "41"}, "41"),  # wrong type
        ([PERSON], "object"),  # not an object
    ],
)
def test_answers_that_do_not_fit_the_schema(answer, field):
    result = verify(json.dumps(answer))
    assert result.reward == 0.0
    assert result.error_type == "validation_error"
    assert field in result.error_message


@pytest.mark.parametrize(
    "text",
    [
        "```json\n" + json.dumps(PERSON) + "\n```",  # code fence
        "Here you go: " + json.dumps(PERSON),  # prose around the JSON
        json.dumps(PERSON)[:-1],  # truncated
        "",  # nothing
        '{"name": "Ada", "age": NaN, "address": {"city": "Lyon"}}',  # NaN is not JSON
        "[" * 100_000 + "]" * 100_000,  # too deep to parse
    ],
    ids=["code-fence", "prose", "truncated", "empty", "nan", "too-deep"],
)
def test_unparseable_answers(text):
    result = verify(text)
    assert result.reward == 0.0 and result.error_type == "parse_error"


def test_no_assistant_message_at_all():
    result = verify(function_call("f", PERSON, call_id="c1"))
    assert result.reward == 0.0 and result.error_type == "parse_error"


def test_nested_anyof_branches_are_strict_too():
    schema = {
        "type": "object",
        "properties": {
            "location": {
                "anyOf": [{"type": "object", "properties": {"city": {"type": "string"}}}, {"type": "null"}]
            }
        },
    }
    assert verify('{"location": null}', schema=schema).reward == 1.0
    assert verify('{"location": {"city": "Oslo"}}', schema=schema).reward == 1.0
    assert verify('{"location": {"city": "Oslo", "zip": "0150"}}', schema=schema).reward == 0.0
    assert verify('{"location": {}}', schema=schema).reward == 0.0


def test_local_refs_resolve():
    schema = {
        "type": "object",
        "properties": {"item": {"$ref": "#/$defs/item"}},
        "$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer"}}}},
    }
    assert verify('{"item": {"id": 1}}', schema=schema).reward == 1.0
    assert verify('{"item": {"id": 1, "x": 2}}', schema=schema).reward == 0.0


@pytest.mark.parametrize(
    "schema_str", ["{not json", '{"type": 5}', '{"properties": {"a": {"minimum": "zero"}}}', "[1]"]
)
def test_broken_schemas_score_zero_as_schema_errors(schema_str):
    result = verify(json.dumps(PERSON), schema_str=schema_str)
    assert result.reward == 0.0 and result.error_type == "schema_error"


def test_only_json_schema_type_is_accepted():
    with pytest.raises(ValidationError):
        StructuredOutputsVerifyRequest(
            responses_create_params=PARAMS, response=make_response("{}"), schema_str="{}", schema_type="yaml"
        )


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_verify():
    with TestClient(new_server().build_app()) as client:
        body = VERIFY.body(json.dumps(PERSON), schema_str=json.dumps(PERSON_SCHEMA), schema_type="json")
        verified = client.post("/verify", json=body)
        assert verified.status_code == 200
        assert verified.json()["reward"] == 1.0 and verified.json()["error_type"] is None
        assert client.post("/verify", json={**body, "schema_type": "xml"}).status_code == 422
        bad = client.post("/verify", json={**body, "response": make_response("nope").model_dump(mode="json")})
        assert bad.status_code == 200 and bad.json()["error_type"] == "parse_error"


# ----------------------------------------------------------------------------------------------- data

IDEAL_ANSWERS = [
    {"name": "Ada Park", "age": 41, "email": "ada.park@example.org"},
    {
        "title": "Simple pancakes",
        "servings": 4,
        "ingredients": [{"item": "flour", "quantity": "200 g"}, {"item": "milk", "quantity": "300 ml"}],
    },
    {"event": "Book club meeting", "date": "2025-03-14", "location": None},
    {
        "books": [
            {"title": "Middlemarch", "author": "George Eliot", "year": 1871},
            {"title": "Moby-Dick", "author": "Herman Melville", "year": 1851},
        ],
        "total": 2,
    },
    {"city": "Reykjavik", "condition": "snow", "temperature_c": -2},
]


def test_example_rows_validate_and_hold_valid_schemas():
    rows = example_rows(__file__)
    assert len(rows) == 5
    for row in rows:
        request = VERIFY.row_request(row, "placeholder")
        schema = json.loads(request.schema_str)
        strictify_schema(schema)
        OAS31Validator.check_schema(schema)
        assert request.schema_str in request.responses_create_params.input[0].content  # the prompt shows it


def test_example_rows_reward_ideal_answers_and_reject_an_extra_key():
    server = new_server()
    for row, answer in zip(example_rows(__file__), IDEAL_ANSWERS, strict=True):
        for candidate, reward in ((answer, 1.0), ({**answer, "extra": 1}, 0.0)):
            result = VERIFY.verify_row(row, json.dumps(candidate), server=server)
            assert result.reward == reward, (row["schema_str"], result.error_message)
