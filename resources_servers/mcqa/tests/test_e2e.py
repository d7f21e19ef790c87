"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

One answer per row, in each row's format: a boxed letter (strict mode), a boxed option text (lenient_boxed), an
`Answer:` line (lenient_answer_colon) and a `Final Choice:` line read by the row's `output_regex`. Row 1 boxes the
option's text where strict mode wants a letter (nothing extracted, 0.0); row 4 picks the wrong animal (0.0).
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule as answer

SCRIPT = [
    answer("shortest year", "Mercury is closest to the Sun, so its orbit is the shortest.\n\n\\boxed{B}"),
    answer("Earth's atmosphere", "Nitrogen, about 78 percent.\n\n\\boxed{Nitrogen}"),
    answer("smallest prime number greater than 20", "21 = 3 x 7, so the answer is \\boxed{\\text{23}}."),
    answer("crewed Moon landing", "Apollo 11 landed in July 1969.\nAnswer: C"),
    answer("is a mammal", "Penguins are warm-blooded, so...\nFinal Choice: B"),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("mcqa", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert [r["extracted_answer"] for r in rows] == ["B", None, "B", "C", "B"]
    assert [r["expected_answer"] for r in rows] == ["B", "D", "B", "C", "C"]
    for row in rows:
        assert [item["type"] for item in row["response"]["output"]] == ["message"]
