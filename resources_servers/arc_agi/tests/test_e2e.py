"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

Row 0 boxes the right grid; row 1 quotes the test input as a bare grid before boxing the right answer (a boxed grid
wins over bare ones); row 2 boxes the test input unchanged (parsed, but wrong); row 3 writes the right grid bare,
with no box at all (accepted); row 4 boxes rows of space-separated digits, which is not a grid (nothing parsed).
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule


def answer(test_input, text):
    """The test input's first row, right after "Test input:", tells the rows apart."""
    return answer_rule("Test input:\n" + test_input + "\n", text, name=test_input)


SCRIPT = [
    answer("3 0 4 0", "Each row is mirrored left to right.\n\\boxed{[[0,4,0,3],[1,9,9,0]]}"),
    answer(
        "1 1 0",
        "The input [[1,1,0],[2,0,1],[0,1,2]] has every 1 turned into 3:\n\\boxed{[[3,3,0],[2,0,3],[0,3,2]]}",
    ),
    answer("1 0 2", "The grid stays as it is.\n\\boxed{[[1,0,2],[0,3,0],[4,0,5],[6,6,6]]}"),
    answer("6 0 7", "Every colored cell falls to the bottom of its column: [[0,0,0],[0,0,0],[6,0,7],[9,8,1]]"),
    answer("0 1 0 1", "The border becomes 4.\n\\boxed{4 4 4 4\n4 6 6 4\n4 6 6 4\n4 4 4 4}"),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("arc_agi", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert [r["task_id"] for r in rows] == [
        "mirror-rows",
        "recolor-ones",
        "transpose",
        "gravity-down",
        "frame-of-fours",
    ]
    assert [r["extraction_successful"] for r in rows] == [True, True, True, True, False]
    assert rows[1]["predicted_output"] == [[3, 3, 0], [2, 0, 3], [0, 3, 2]]
    assert rows[2]["predicted_output"] == [[1, 0, 2], [0, 3, 0], [4, 0, 5], [6, 6, 6]]
    assert rows[4]["predicted_output"] is None
    for row in rows:
        assert [item["type"] for item in row["response"]["output"]] == ["message"]
