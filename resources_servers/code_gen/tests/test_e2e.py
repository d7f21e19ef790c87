"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with a scripted fake LLM.

The shipped config has `ray: true`, so ng_run starts a Ray cluster and the unit tests run as Ray tasks (the one
real Ray start of this server's tests). The fake LLM answers every row with a fenced solution: rows 0, 1, 3 and 4
correctly (row 4 with a reasoning item first), row 2 with a program that prints the words in the original order
instead of reversed (0.0).
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule


def answer(question_part, code, *, reasoning=None):
    output = [{"type": "reasoning", "text": reasoning}] if reasoning else []
    output.append(f"Here is a solution.\n\n```python\n{code}\n```")
    return answer_rule(question_part, *output)


SCRIPT = [
    answer("Vowel count.", "print(sum(ch in 'aeiouAEIOU' for ch in input()))"),
    answer(
        "Second largest.", "input()\nv = sorted(set(map(int, input().split())))\nprint(v[-2] if len(v) > 1 else -1)"
    ),
    answer("Word order.", "print(' '.join(input().split()))"),
    answer(
        "Balanced brackets.",
        "def is_balanced(s):\n    stack = []\n    for ch in s:\n        if ch in '([{':\n            stack.append(ch)\n"
        "        elif ch in ')]}':\n            if not stack or '([{'[')]}'.index(ch)] != stack.pop():\n"
        "                return False\n    return not stack",
    ),
    answer(
        "Longest run.",
        "import itertools\n\nclass Solution:\n    def longestRun(self, s: str, k: int) -> List[int]:\n"
        "        best, start = [0, -1], 0\n        for _, group in itertools.groupby(s):\n"
        "            n = len(list(group))\n            if n >= k and n > best[0]:\n                best = [n, start]\n"
        "            start += n\n        return best",
        reasoning="Scan the runs with groupby and keep the first longest one.",
    ),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("code_gen", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert [r["result"] for r in rows] == [[True] * 4, [True] * 4, [-2], [True] * 5, [True] * 4]
    assert rows[2]["metadata"]["error_message"] == "Wrong Answer"
    assert rows[2]["metadata"]["output"] == "the quick brown fox\n"
    assert all(r["metadata"]["executor"] == "ray" for r in rows)
    assert all(r["reasoning_format_violation_rate"] == 0.0 for r in rows)
    assert all(r["extracted_model_code"].startswith(("print", "input", "def", "import")) for r in rows)
    assert [item["type"] for item in rows[4]["response"]["output"]] == ["reasoning", "message"]
