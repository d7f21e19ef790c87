import time

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nemo_gym.testing.responses import function_call, function_call_output, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.mcqa.app import MCQAResourcesServer, MCQAVerifyRequest, boxed_contents, strip_text_wrappers

PARAMS = {"input": [{"role": "user", "content": "Which planet has the shortest year? A) Venus B) Mercury ..."}]}
OPTIONS = [{"A": "Venus"}, {"B": "Mercury"}, {"C": "Mars"}, {"D": "Jupiter"}]


def new_server() -> MCQAResourcesServer:
    return make_server(MCQAResourcesServer, name="mcqa", domain="knowledge")


verify = Verifier(new_server, MCQAVerifyRequest, PARAMS, options=OPTIONS, expected_answer="B")


def extracted(text: str, **fields):
    return verify(text, **fields).extracted_answer


# ----------------------------------------------------------------------------------------------- helpers


def test_boxed_contents_balances_braces_and_skips_unclosed_boxes():
    assert list(boxed_contents(r"a \boxed{B} b \boxed{\text{C}} c")) == ["B", r"\text{C}"]
    assert list(boxed_contents(r"\boxed{B")) == []
    assert list(boxed_contents("no box")) == []


def test_strip_text_wrappers():
    assert strip_text_wrappers(r" \text{ \text{Mercury} } ") == "Mercury"
    assert strip_text_wrappers(r"\text{a} and \text{b}") == r"\text{a} and \text{b}"
    assert strip_text_wrappers(r"\text{Mercury") == r"\text{Mercury"


def test_degenerate_output_is_handled_in_linear_time():
    started = time.perf_counter()
    nested = "\\text{ " * 50_000 + "Mercury" + " }" * 50_000
    assert strip_text_wrappers(nested) == "Mercury"
    assert extracted("Answer: " + nested, grading_mode="lenient_answer_colon") == "B"
    assert extracted("\\boxed{" + nested + "}", grading_mode="lenient_boxed") == "B"
    assert extracted("\\boxed{" * 100_000, grading_mode="lenient_boxed") is None
    assert time.perf_counter() - started < 5.0


# ----------------------------------------------------------------------------------------------- strict mode


@pytest.mark.parametrize(
    "text, letter",
    [
        (r"The answer is \boxed{B}.", "B"),
        (r"Final: \boxed{ [B] }", "B"),
        (r"\boxed{(B).}", "B"),
        (r"\boxed{42} then \boxed{B}", "B"),  # the first box with a single letter counts
        (r"\boxed{C} then \boxed{B}", "C"),
        (r"\boxed{E} then \boxed{B}", None),  # first letter box is not an option: no answer
        (r"\boxed{b}", None),  # lowercase is not strict
        (r"\boxed{AB}", None),
        (r"\boxed{\text{B}}", None),  # letters around the answer
        (r"\boxed{Mercury}", None),
        ("The answer is B", None),  # no box
        (r"\boxed{B", None),  # unclosed box
        (r"\boxed{7} ... B}", None),  # a box ends at its own closing brace
        ("", None),
    ],
)
def test_strict_single_letter_boxed(text, letter):
    assert extracted(text) == letter


def test_strict_is_the_default_mode():
    assert MCQAVerifyRequest(responses_create_params=PARAMS, response=make_response("x")).grading_mode == (
        "strict_single_letter_boxed"
    )


def test_correct_and_wrong_rewards():
    right = verify(r"\boxed{B}")
    assert right.reward == 1.0 and right.extracted_answer == "B" and right.expected_answer == "B"
    wrong = verify(r"\boxed{A}")
    assert wrong.reward == 0.0 and wrong.extracted_answer == "A"
    unparsed = verify("Mercury, obviously.")
    assert unparsed.reward == 0.0 and unparsed.extracted_answer is None


# ----------------------------------------------------------------------------------------------- lenient_boxed


@pytest.mark.parametrize(
    "text, letter",
    [
        (r"\boxed{B}", "B"),  # strict first
        (r"\boxed{Mercury}", "B"),
        (r"\boxed{\text{ mercury }}", "B"),
        (r"\boxed{The planet  MERCURY}", "B"),  # normalized substring
        (r"\boxed{Mercury or Venus}", None),  # two options match
        (r"\boxed{Pluto} \boxed{Mercury}", None),  # only the first box is read
        (r"\boxed{b}", None),  # a lowercase letter is neither strict nor an option text
        ("Mercury", None),  # no box
    ],
)
def test_lenient_boxed(text, letter):
    assert extracted(text, grading_mode="lenient_boxed") == letter


def test_lenient_boxed_ignores_empty_option_texts():
    options = [{"A": ""}, {"B": "Mercury"}]
    assert extracted(r"\boxed{Mercury}", grading_mode="lenient_boxed", options=options) == "B"


# ----------------------------------------------------------------------------------------------- lenient_answer_colon


@pytest.mark.parametrize(
    "text, letter",
    [
        ("Answer: B", "B"),
        ("answer: b", "B"),
        (r"ANSWER : \text{B}", "B"),
        ("Answer: mercury", "B"),  # exactly an option's text
        ("Answer:   Mercury  ", "B"),
        ("Answer: Mercury, the closest planet", None),  # not exactly an option text
        ("Answer: E", None),  # not an option
        ("Answer: A\nOn second thought... Answer: B", "A"),  # the first Answer line counts
        (r"\boxed{B}", None),  # no Answer line
    ],
)
def test_lenient_answer_colon(text, letter):
    assert extracted(text, grading_mode="lenient_answer_colon") == letter


# ----------------------------------------------------------------------------------------------- lenient_answer_colon_md
# NeMo Gym v0.5's markdown-aware `Answer:` mode (its mmlu, mmlu_pro and gpqa benchmark configs set it server-wide).


@pytest.mark.parametrize(
    "text, letter",
    [
        ("The answer is B.\n\nAnswer: B", "B"),
        ("Reasoning here.\n\n**Answer: B**", "B"),  # bold around the whole line
        ("**Answer:** B", "B"),  # bold around the marker only
        ("__Answer__: B", "B"),
        ("*Answer*: b", "B"),  # lowercase letter alone
        ("Answer: B because Mercury is closest", "B"),  # a letter leading the payload
        ("Answer: C) Mars\nAnswer: B) Mercury", "B"),  # the LAST answer line wins
        ("Answer: B\nAnswer: I am not sure", "B"),  # ... that names a letter
        ("Answer: the right option is B.", "B"),  # the last capital letter standing as a word
        ("Answer: A or B", None),  # a list of choices names none
        ("Answer: A/B", None),
        ("Answer: E", None),  # not an option
        ("Answer: mercury", None),  # option text is not read in this mode
        ("I think it might be B but I'm not sure", None),  # no marker
        (r"\boxed{B}", None),  # no marker, no answer_prefix: boxes are not read
        ("Answer: \uff22", "B"),  # full-width letter
        ("Answer: \u0628", "B"),  # the Arabic letter written for B
    ],
)
def test_lenient_answer_colon_md(text, letter):
    assert extracted(text, grading_mode="lenient_answer_colon_md") == letter


def test_lenient_answer_colon_md_reads_the_rows_answer_prefix_then_a_box():
    prefix = {"answer_prefix": "R\u00e9ponse :"}
    assert extracted("R\u00e9ponse : B", grading_mode="lenient_answer_colon_md", template_metadata=prefix) == "B"
    assert extracted("r\u00e9ponse : b", grading_mode="lenient_answer_colon_md", template_metadata=prefix) == "B"
    # with a prefix set, a boxed letter is the last resort
    assert extracted(r"\boxed{B}", grading_mode="lenient_answer_colon_md", template_metadata=prefix) == "B"
    assert extracted(r"\boxed{B}", grading_mode="lenient_answer_colon_md") is None


def test_plain_lenient_answer_colon_does_not_read_markdown():
    assert extracted("**Answer: B**", grading_mode="lenient_answer_colon") is None
    assert extracted("**Answer: B**", grading_mode="lenient_answer_colon_md") == "B"


def test_server_wide_lenient_answer_colon_md_replaces_the_rows_mode():
    server = make_server(MCQAResourcesServer, name="mcqa", domain="knowledge", grading_mode="lenient_answer_colon_md")
    result = verify("Some thinking.\n**Answer:** B", server=server, grading_mode="strict_single_letter_boxed")
    assert (result.grading_mode, result.extracted_answer, result.reward) == ("lenient_answer_colon_md", "B", 1.0)
    wrong = verify("**Answer:** C", server=server)
    assert (wrong.extracted_answer, wrong.reward) == ("C", 0.0)


# ----------------------------------------------------------------------------------------------- output_regex


@pytest.mark.parametrize(
    "text, regex, letter",
    [
        ("Final Choice: B", r"Final Choice:\s*([A-Za-z])", "B"),  # beats the strict default
        ("final choice: b", r"Final Choice:\s*([A-Z])", "B"),  # case-insensitive
        ("Final Choice: A ... no wait. Final Choice: B", r"Final Choice:\s*([A-Z])", "B"),  # last match
        ("Final Choice: E", r"Final Choice:\s*([A-Z])", "E"),  # a letter is accepted even if not an option
        ("Final Choice: Mercury", r"Final Choice:\s*(\w+)", "B"),  # an option's text
        ("Pick: B", r"Pick: (X=)?([A-Z])", "B"),  # several groups: the first one that matched something
        ("Option (C)", r"Option \(([A-Z])\)|Option ([A-Z])", "C"),
    ],
)
def test_output_regex(text, regex, letter):
    assert extracted(text, template_metadata={"output_regex": regex}) == letter


def test_output_regex_falls_back_to_the_grading_mode():
    # No match: the grading mode decides.
    assert extracted(r"\boxed{B}", template_metadata={"output_regex": r"Final Choice:\s*([A-Z])"}) == "B"
    # Invalid pattern: same.
    assert extracted(r"\boxed{B}", template_metadata={"output_regex": "(["}) == "B"
    # A match that is neither a letter nor an option text: same.
    assert extracted(r"Final Choice: Pluto \boxed{C}", template_metadata={"output_regex": r"Choice: (\w+)"}) == "C"
    # Not a usable pattern at all: ignored.
    assert extracted(r"\boxed{B}", template_metadata={"output_regex": ""}) == "B"
    assert extracted(r"\boxed{B}", template_metadata={"other": 1}) == "B"


def test_output_regex_works_without_options():
    result = verify("Final Choice: B", options=None, template_metadata={"output_regex": r"Final Choice:\s*([A-Z])"})
    assert result.reward == 1.0


# ----------------------------------------------------------------------------------------------- text gathering


def test_all_assistant_texts_are_read_and_other_items_ignored():
    output = [
        reasoning(r"maybe \boxed{A}"),
        function_call("search", r'{"q": "\\boxed{C}"}', call_id="c1"),
        function_call_output(r"\boxed{D}", call_id="c1"),
        {
            "id": "msg_0",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "refusal", "refusal": r"\boxed{A}"}],
        },
        message("Let me think.", msg_id="msg_1"),
        message("Both parts", r"count: \boxed{B}", msg_id="msg_2"),
    ]
    assert verify(*output).extracted_answer == "B"


def test_assistant_message_with_plain_string_content():
    assert verify({"type": "message", "role": "assistant", "content": r"\boxed{B}"}).extracted_answer == "B"


def test_empty_output_scores_zero():
    result = verify()
    assert result.reward == 0.0 and result.extracted_answer is None


# ----------------------------------------------------------------------------------------------- gold + options


def test_gold_is_normalized_and_missing_gold_scores_zero():
    assert verify(r"\boxed{B}", expected_answer=" b ").expected_answer == "B"
    assert verify(r"\boxed{B}", expected_answer=" b ").reward == 1.0
    missing = verify(r"\boxed{B}", expected_answer=None)
    assert missing.reward == 0.0 and missing.expected_answer == ""


def test_allowed_letters_come_from_single_letter_keys_with_text():
    options = [{"a": "Venus"}, {"B": None}, {"CC": "Mars"}, {"D": "Jupiter"}]
    assert extracted(r"\boxed{A}", options=options) == "A"  # lowercase key
    assert extracted(r"\boxed{B}", options=options) is None  # null text
    assert extracted(r"\boxed{D}", options=options) == "D"
    assert extracted(r"\boxed{A}", options=None) is None


def test_request_fields_are_echoed():
    result = verify(
        r"\boxed{B}", uuid="q-1", metadata={"source": "test"}, template_metadata={"output_regex": "x(y)"}
    )
    assert result.uuid == "q-1" and result.metadata == {"source": "test"}
    assert result.options == OPTIONS and result.grading_mode == "strict_single_letter_boxed"
    assert result.template_metadata == {"output_regex": "x(y)"}


def test_unknown_grading_mode_is_rejected():
    with pytest.raises(ValidationError):
        MCQAVerifyRequest(responses_create_params=PARAMS, response=make_response("x"), grading_mode="fuzzy")


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_verify():
    with TestClient(new_server().build_app()) as client:
        body = verify.body(r"\boxed{B}")
        verified = client.post("/verify", json=body)
        assert verified.status_code == 200
        assert verified.json()["reward"] == 1.0 and verified.json()["extracted_answer"] == "B"
        assert client.post("/verify", json={**body, "grading_mode": "fuzzy"}).status_code == 422


# ----------------------------------------------------------------------------------------------- data


def ideal_answer(row: dict) -> str:
    letter = row["expected_answer"]
    if "template_metadata" in row:
        return f"Dolphins breathe air and nurse their young.\nFinal Choice: {letter}"
    if row["grading_mode"] == "lenient_answer_colon":
        return f"Apollo 11.\nAnswer: {letter}"
    text = next(option[letter] for option in row["options"] if letter in option)
    return rf"\boxed{{{text}}}" if row["grading_mode"] == "lenient_boxed" else rf"\boxed{{{letter}}}"


def test_example_rows_validate_and_cover_every_mode():
    rows = example_rows(__file__)
    assert len(rows) == 5
    requests = [verify.row_request(row, "placeholder") for row in rows]
    assert {request.grading_mode for request in requests} == {
        "strict_single_letter_boxed",
        "lenient_boxed",
        "lenient_answer_colon",
    }
    assert any(request.template_metadata for request in requests)


def test_example_rows_reward_ideal_answers():
    server = new_server()
    for row in example_rows(__file__):
        assert verify.verify_row(row, ideal_answer(row), server=server).reward == 1.0, row["uuid"]
