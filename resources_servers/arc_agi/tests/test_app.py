import json
import random
import re
import time

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from nemo_gym.testing.responses import function_call, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.arc_agi.app import ARCAGIResourcesServer, ARCAGIVerifyRequest, grid_candidates, parse_grid

PARAMS = {"input": [{"role": "user", "content": "Mirror the grid. Test input: [[1, 2], [3, 4]]"}]}
EXPECTED = [[2, 1], [4, 3]]


def new_server() -> ARCAGIResourcesServer:
    return make_server(ARCAGIResourcesServer, name="arc_agi", domain="knowledge")


verify = Verifier(
    new_server, ARCAGIVerifyRequest, PARAMS, expected_output=EXPECTED, test_input=[[1, 2], [3, 4]], task_id="mirror"
)


# ----------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, grid",
    [
        (r"The answer is \boxed{[[2,1],[4,3]]}.", [[2, 1], [4, 3]]),
        ("\\boxed{[[2, 1],\n [4, 3]]}", [[2, 1], [4, 3]]),  # whitespace inside the grid
        (r"\boxed{[ [7] ]}", [[7]]),
        (r"\boxed{[[1]]} and later \boxed{[[2]]}", [[1]]),  # the first valid box
        (r"\boxed{[[1],[2,]]} then \boxed{[[3]]}", [[3]]),  # an invalid box is skipped
        (r"\boxed{[[[1]]]} \boxed{[[4]]}", [[4]]),  # three levels is not a grid
        (r"\boxed{[[1],[2,]]} but really [[5]]", None),  # boxes exist but none is valid: no bare fallback
        ("I think it is [[9, 9], [9, 9]] or [[1]]", [[9, 9], [9, 9]]),  # bare: the first valid one
        ("[[1,], [2]] or [[3]]", [[3]]),
        (r"\boxed{ [[6]] }", [[6]]),  # spaces around the grid: not a boxed grid, but a bare one
        (r"\boxed{[[1],[2, 3]]}", [[1], [2, 3]]),  # rows of different lengths still parse
        ("[[1, 2], []]", [[1, 2], []]),  # only the first row must be non-empty
        ("[[], [1]]", None),
        ("[[ ]]", None),
        ("[[-1, 2]]", None),  # digits only: no signs
        ("[[1.5]]", None),
        ("[1, 2, 3]", None),  # one level
        ("no grid here", None),
        ("", None),
    ],
)
def test_parse_grid(text, grid):
    assert parse_grid(text) == grid


REFERENCE_GRID = r"\[\s*\[[\d\s,\[\]]+\]\s*\]"


def reference_candidates(text: str) -> list[str]:
    """The plain-regex formulation of the search (quadratic on degenerate input, fine for short strings)."""
    return re.findall(r"\\boxed\{(" + REFERENCE_GRID + r")\}", text) or re.findall(REFERENCE_GRID, text)


def test_candidates_match_the_plain_regex_formulation():
    rng = random.Random(1234)
    alphabet = ["[", "]", "[[", "]]", "1", "23", ",", " ", "\n", "\\boxed{", "}", "x", "-"]
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        assert grid_candidates(text) == reference_candidates(text), text


@pytest.mark.parametrize(
    "text",
    ["[[1," * 30_000, "[" * 100_000, "\\boxed{[[1," * 15_000, "[[" + " " * 100_000 + "1", "]" * 100_000],
    ids=["repeated-openings", "brackets", "repeated-boxes", "whitespace", "closings"],
)
def test_degenerate_output_is_parsed_in_linear_time(text):
    started = time.perf_counter()
    assert parse_grid(text) is None
    assert time.perf_counter() - started < 2.0


# ----------------------------------------------------------------------------------------------- verify


def test_correct_grid_gets_reward_one():
    result = verify(r"Each row is reversed: \boxed{[[2,1],[4,3]]}")
    assert result.reward == 1.0
    assert result.extraction_successful is True and result.predicted_output == EXPECTED
    assert result.task_id == "mirror" and result.expected_output == EXPECTED  # echoed


def test_wrong_grid_is_parsed_but_scores_zero():
    result = verify(r"\boxed{[[1,2],[3,4]]}")
    assert result.reward == 0.0
    assert result.extraction_successful is True and result.predicted_output == [[1, 2], [3, 4]]
    # Same cells, other shape.
    assert verify(r"\boxed{[[2,1,4,3]]}").reward == 0.0


@pytest.mark.parametrize("text", ["The rule is a mirror.", r"\boxed{2 1 / 4 3}", r"\boxed{[[2,1],[4,3]}", ""])
def test_unparseable_answers_score_zero(text):
    result = verify(text)
    assert result.reward == 0.0
    assert result.extraction_successful is False and result.predicted_output is None


def test_text_of_all_assistant_messages_is_read():
    thought = reasoning(r"\boxed{[[0]]}")
    tool = function_call("f", {"g": [[0]]}, call_id="c1")
    answer = message(r"\boxed{[[2,1],", "[4,3]]}", msg_id="m2")  # split across two parts
    result = verify(thought, tool, message("Thinking...", msg_id="m1"), answer)
    assert result.reward == 1.0


def test_no_output_at_all():
    result = verify()
    assert result.reward == 0.0 and result.extraction_successful is False


def test_expected_output_is_required_and_must_be_a_grid():
    with pytest.raises(ValidationError):
        ARCAGIVerifyRequest(responses_create_params=PARAMS, response=make_response("x"))
    with pytest.raises(ValidationError):
        ARCAGIVerifyRequest(responses_create_params=PARAMS, response=make_response("x"), expected_output=[1, 2])


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_verify():
    with TestClient(new_server().build_app()) as client:
        body = verify.body(r"\boxed{[[2,1],[4,3]]}")
        verified = client.post("/verify", json=body)
        assert verified.status_code == 200
        assert verified.json()["reward"] == 1.0 and verified.json()["predicted_output"] == EXPECTED
        assert client.post("/verify", json={**body, "expected_output": "[[2,1]]"}).status_code == 422


# ----------------------------------------------------------------------------------------------- data


def grid_text(grid) -> str:
    return "\n".join(" ".join(str(cell) for cell in row) for row in grid)


def test_example_rows_validate_and_show_their_grids():
    rows = example_rows(__file__)
    assert len(rows) == 5
    for row in rows:
        request = verify.row_request(row, "placeholder")
        prompt = request.responses_create_params.input[0].content
        assert grid_text(request.test_input) in prompt
        for pair in request.train:
            assert grid_text(pair["input"]) in prompt and grid_text(pair["output"]) in prompt
        assert grid_text(request.expected_output) not in prompt


def test_example_rows_reward_the_expected_grid():
    server = new_server()
    for row in example_rows(__file__):
        answer = rf"The rule is clear. \boxed{{{json.dumps(row['expected_output'])}}}"
        assert verify.verify_row(row, answer, server=server).reward == 1.0, row["task_id"]
