"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

One answer per row, in each of the forms the server reads: `<answer>` tags (leg_counting), a box
(spell_backward), bare text (basic_arithmetic). word_sorting gets two words swapped (the task's partial credit:
7 of 9 words in place) and knights_knaves gets both people wrong (0.0).
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule as answer

SCRIPT = [
    answer("5 grasshoppers", "5x6 + 8x0 + 6x4 + 10x8 + 15x8 + 15x6 + 4x6 + 9x10 + 3x14 = 500\n<answer>500</answer>"),
    answer("hypomeron", "Reading it from the end: \\boxed{noremopyh}"),
    answer("-1515 / 5", "106475279601"),
    answer(
        "received, Hart",
        "<answer>Hart, find, inform, necessarily, profit, received, subscribers, undertaking, tax</answer>",
    ),
    answer("Victoria", "<answer>Victoria is a knave, and Jacob is a knight.</answer>"),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("reasoning_gym", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["task_name"] for r in rows] == [
        "leg_counting",
        "spell_backward",
        "basic_arithmetic",
        "word_sorting",
        "knights_knaves",
    ]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0, 7 / 9, 0.0]
    assert [r["score"] for r in rows] == [r["reward"] for r in rows]
    assert [r["extracted_answer"] for r in rows] == [
        "500",
        "noremopyh",
        "106475279601",
        "Hart, find, inform, necessarily, profit, received, subscribers, undertaking, tax",
        "Victoria is a knave, and Jacob is a knight.",
    ]
    for row in rows:
        assert row["score_error"] is None
        assert row["metadata"]["source_dataset"] == row["task_name"]
        assert [item["type"] for item in row["response"]["output"]] == ["message"]
