"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

Rows 0-2 answer with JSON that fits the schema (row 2 with `null` for the optional-by-anyOf location). Row 3 leaves
`year` out of a book: the schema only lists it under `$defs`, and strictification makes it required there too, so
that is a validation error. Row 4 wraps correct JSON in a Markdown code fence, a parse error.
"""

import json

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule as answer

SCRIPT = [
    answer("librarian named Ada Park", json.dumps({"name": "Ada Park", "age": 41, "email": "ada.park@example.org"})),
    answer(
        "pancake recipe",
        json.dumps(
            {
                "title": "Simple pancakes",
                "servings": 4,
                "ingredients": [
                    {"item": "flour", "quantity": "250 g"},
                    {"item": "milk", "quantity": "500 ml"},
                    {"item": "eggs", "quantity": "2"},
                ],
            }
        ),
    ),
    answer("book club meeting", json.dumps({"event": "Book club meeting", "date": "2025-03-14", "location": None})),
    answer(
        "two classic novels",
        json.dumps(
            {
                "books": [
                    {"title": "Middlemarch", "author": "George Eliot", "year": 1871},
                    {"title": "Moby-Dick", "author": "Herman Melville"},
                ],
                "total": 2,
            }
        ),
    ),
    answer(
        "weather in Reykjavik",
        "```json\n" + json.dumps({"city": "Reykjavik", "condition": "snow", "temperature_c": -2}) + "\n```",
    ),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("structured_outputs", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [r["error_type"] for r in rows] == [None, None, None, "validation_error", "parse_error"]
    assert "'year' is a required property" in rows[3]["error_message"]
    assert [r["error_message"] for r in rows[:3]] == [None, None, None]
    for row in rows:
        assert [item["type"] for item in row["response"]["output"]] == ["message"]
