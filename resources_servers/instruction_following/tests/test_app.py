"""The verify endpoint: answer text selection, grading modes, per-instruction errors, request models, data."""

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nemo_gym.testing.responses import function_call, function_call_output, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.instruction_following.app import (
    InstructionFollowingResourcesServer,
    InstructionFollowingVerifyRequest,
)

PROMPT = "Describe the sea in fewer than 10 words, in lowercase, without commas."
PARAMS = {"input": [{"role": "user", "content": PROMPT}]}
IDS = ["change_case:english_lowercase", "punctuation:no_comma", "length_constraints:number_words"]
KWARGS = [None, {}, {"num_words": 10, "relation": "less than"}]


def new_server() -> InstructionFollowingResourcesServer:
    return make_server(
        InstructionFollowingResourcesServer, name="instruction_following", domain="instruction_following"
    )


verify = Verifier(new_server, InstructionFollowingVerifyRequest, PARAMS, instruction_id_list=IDS, kwargs=KWARGS)


# ------------------------------------------------------------------------------------------------- grading


def test_all_followed_binary():
    result = verify("calm blue water under a quiet sky")
    assert result.reward == 1.0
    assert result.follow_all_instructions is True
    assert result.follow_instruction_list == [True, True, True]
    assert result.instruction_errors == [None, None, None]


def test_one_broken_binary_scores_zero():
    result = verify("Calm blue water under a quiet sky")
    assert result.reward == 0.0
    assert result.follow_all_instructions is False
    assert result.follow_instruction_list == [False, True, True]


@pytest.mark.parametrize(
    ("text", "reward", "followed"),
    [
        ("calm blue water under a quiet sky", 1.0, [True, True, True]),
        ("calm, blue water under a quiet sky", 2 / 3, [True, False, True]),
        ("Calm, blue water under a quiet sky", 1 / 3, [False, False, True]),
        ("Calm, blue water under a quiet grey sky with gulls overhead", 0.0, [False, False, False]),
    ],
)
def test_fraction_grading(text, reward, followed):
    result = verify(text, grading_mode="fraction")
    assert result.reward == reward
    assert result.follow_instruction_list == followed
    assert result.follow_all_instructions is all(followed)


def test_binary_is_the_default_mode():
    result = verify("Calm blue water")
    assert result.grading_mode == "binary" and result.reward == 0.0


def test_no_instructions_scores_zero_in_both_modes():
    for mode in ("binary", "fraction"):
        result = verify("anything", instruction_id_list=[], kwargs=[], grading_mode=mode)
        assert result.reward == 0.0
        assert result.follow_all_instructions is False
        assert result.follow_instruction_list == [] and result.instruction_errors == []


def test_unknown_id_is_a_validation_error_naming_it_with_a_suggestion():
    ids = ["punctuation:no_comma", "keywords:forbiden_words", "startend:quotation"]
    with pytest.raises(ValidationError) as err:
        verify('"no commas here"', instruction_id_list=ids, kwargs=[None, {"forbidden_words": ["x"]}, None])
    text = str(err.value)
    assert "instruction_id_list[1]" in text and "unknown instruction id 'keywords:forbiden_words'" in text
    assert "Did you mean `keywords:forbidden_words`?" in text
    with pytest.raises(ValidationError, match="unknown instruction id 'language:klingon'"):
        verify('"no commas"', instruction_id_list=["language:klingon"], kwargs=None)


def test_invalid_kwargs_are_a_validation_error_naming_the_instruction():
    with pytest.raises(ValidationError) as err:
        verify("calm sea", kwargs=[None, None, {"num_words": 10, "relation": "roughly"}])
    text = str(err.value)
    assert "instruction_id_list[2]" in text and "length_constraints:number_words" in text
    assert "relation must be one of ['less than', 'at least']" in text


def test_missing_kwargs_entries_count_as_null():
    # Missing list: every instruction without kwargs; number_words then lacks its required kwargs.
    with pytest.raises(ValidationError, match="missing 2 required keyword-only arguments"):
        verify("calm sea", kwargs=None)
    # Shorter list: the missing tail is null (so the same error); longer list: extra entries are ignored.
    with pytest.raises(ValidationError, match="missing 2 required keyword-only arguments"):
        verify("calm sea", kwargs=[None])
    longer = KWARGS + [{"num_words": 1, "relation": "at least"}]
    assert verify("calm sea", kwargs=longer).follow_instruction_list == [True, True, True]


def test_ifeval_style_kwargs_with_every_key_and_nulls():
    every_key = {"num_words": None, "relation": None, "keywords": None, "postscript_marker": None}
    kwargs = [every_key, every_key, {**every_key, "num_words": 10, "relation": "less than"}]
    assert verify("calm sea", kwargs=kwargs).reward == 1.0


# --------------------------------------------------------------------------------------------- answer text


def test_only_the_last_assistant_message_is_graded():
    result = verify(message("Draft, With Commas.", msg_id="msg_0"), message("calm sea", msg_id="msg_1"))
    assert result.reward == 1.0
    result = verify(message("calm sea", msg_id="msg_0"), message("Final, With Commas.", msg_id="msg_1"))
    assert result.reward == 0.0


def test_output_text_parts_of_the_last_message_are_joined_and_refusals_ignored():
    final = message("calm ", "sea", msg_id="msg_2")
    final["content"].insert(1, {"type": "refusal", "refusal": "I, Cannot"})
    assert verify(final).reward == 1.0
    at_least_5_words = [None, None, {"num_words": 5, "relation": "at least"}]
    two_parts = verify(message("calm sea ", "and quiet sky", msg_id="msg_2"), kwargs=at_least_5_words)
    assert two_parts.reward == 1.0  # 6 words across both parts


def test_items_after_the_last_message_are_not_graded():
    output = [
        message("calm sea"),
        function_call("search", {}, call_id="c1"),
        function_call_output("Tool, Output", call_id="c1"),
        reasoning("Thinking, Loudly"),
    ]
    assert verify(*output).reward == 1.0


def test_assistant_message_with_plain_string_content():
    assert verify({"type": "message", "role": "assistant", "content": "calm sea"}).reward == 1.0


@pytest.mark.parametrize(
    "output",
    [
        [],
        [reasoning("calm sea")],
        [function_call("search", {"q": "calm sea"}, call_id="c1")],
        [{"type": "message", "role": "assistant", "id": "m", "content": [{"type": "refusal", "refusal": "no"}]}],
        [{"type": "message", "role": "assistant", "id": "m", "content": []}],
    ],
    ids=["no_output", "reasoning_only", "tool_call_only", "refusal_only", "empty_content"],
)
def test_malformed_model_output_is_graded_as_empty_text(output):
    result = verify(*output, grading_mode="fraction")
    # Empty text: not lowercase (no letters), no commas, 0 words (< 10).
    assert result.follow_instruction_list == [False, True, True]
    assert result.reward == 2 / 3
    assert result.instruction_errors == [None, None, None]


# -------------------------------------------------------------------------------------------- request model


def test_request_fields_are_echoed():
    result = verify("calm sea", id=7, prompt=PROMPT, grading_mode="fraction")
    assert result.id == 7 and result.prompt == PROMPT
    assert result.instruction_id_list == IDS and result.kwargs == KWARGS
    assert result.grading_mode == "fraction"
    assert result.responses_create_params.input[0].content == PROMPT
    assert verify("calm sea", id="row-7").id == "row-7"


def test_invalid_requests_are_rejected():
    response = make_response("x")
    with pytest.raises(ValidationError):
        InstructionFollowingVerifyRequest(
            responses_create_params=PARAMS, response=response, instruction_id_list=IDS, grading_mode="partial"
        )
    with pytest.raises(ValidationError):
        InstructionFollowingVerifyRequest(responses_create_params=PARAMS, response=response)  # no instruction list
    with pytest.raises(ValidationError):
        InstructionFollowingVerifyRequest(
            responses_create_params=PARAMS, response=response, instruction_id_list=IDS, kwargs=["num_words=3"]
        )


# ------------------------------------------------------------------------------------------------ over HTTP


def test_http_verify():
    with TestClient(new_server().build_app()) as client:
        body = verify.body(
            "calm, sea", instruction_id_list=IDS, kwargs=KWARGS, grading_mode="fraction", id=3, prompt=PROMPT
        )
        verified = client.post("/verify", json=body)
        assert verified.status_code == 200
        payload = verified.json()
        assert payload["reward"] == 2 / 3
        assert payload["follow_instruction_list"] == [True, False, True]
        assert payload["follow_all_instructions"] is False
        assert payload["instruction_errors"] == [None, None, None]
        assert payload["id"] == 3 and payload["prompt"] == PROMPT
        assert client.post("/verify", json={**body, "grading_mode": "partial"}).status_code == 422
        unknown_id = {**body, "instruction_id_list": IDS + ["no:such_id"], "kwargs": KWARGS + [None]}
        unknown = client.post("/verify", json=unknown_id)
        assert unknown.status_code == 422
        assert "unknown instruction id 'no:such_id'" in unknown.text


# ----------------------------------------------------------------------------------------------------- data


IDEAL_ANSWERS = [
    "the sea turns from grey to gold as the sun climbs out of the water.",
    "<<Happy Houseplants>>\n\n* Water only when the soil is dry.\n* Give each plant enough light.\n"
    "* Wipe dust off the leaves.\n\nP.S. Talk to them too.",
    "Carry a compass and plenty of water and tell a friend your route. Is there anything else I can help with?",
    '```json\n{"fact_1": "Every zebra has its own stripes.", "fact_2": "A zebra foal can walk within an hour."}\n```',
    "Here is your guide to bread.\n\nSection 1\nMix and knead for *ten minutes*.\n\nSection 2\nBake until "
    "*deep brown*.",
]


def test_example_rows_validate_and_use_only_known_instructions():
    from resources_servers.instruction_following.instructions import INSTRUCTION_REGISTRY

    rows = example_rows(__file__)
    assert len(rows) == 5
    for row in rows:
        request = verify.row_request(row, "placeholder")
        assert set(request.instruction_id_list) <= set(INSTRUCTION_REGISTRY)
        assert len(request.kwargs) == len(request.instruction_id_list)
        assert request.prompt == row["responses_create_params"]["input"][0]["content"]
    assert {row["grading_mode"] for row in rows} == {"binary", "fraction"}


def test_example_rows_reward_ideal_answers():
    server = new_server()
    for row, answer in zip(example_rows(__file__), IDEAL_ANSWERS, strict=True):
        result = verify.verify_row(row, answer, server=server)
        assert result.reward == 1.0, (row["id"], result.follow_instruction_list, result.instruction_errors)
