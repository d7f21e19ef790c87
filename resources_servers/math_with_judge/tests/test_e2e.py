"""The 5 examples through a real stack (ng_run + ng_collect_rollouts) with the scripted fake LLM.

The second test turns the judge on: the judge model server is `policy_model` (the shipped default), so the judge
calls go over real HTTP through `openai_model` to the same fake backend, whose rules answer `[[A=B]]` / `[[A!=B]]`.
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rules, rule

# Policy replies, matched on the question (the judge prompt also holds the question: judge rules come first).
POLICY = {
    "cups of sugar": r"3/4 + 1/8 = 6/8 + 1/8, so the cake needs \boxed{\frac{7}{8}} cups.",
    "2x + 6 = 20": r"2x = 14, so x = \boxed{7}.",
    "Expand (x + 2)^2": r"\boxed{4 + 4x + x^2}",
    "divisors does 36": r"36 = 2^2 \cdot 3^2, so it has \boxed{8} divisors.",  # wrong: 9
    "simplest radical form": r"\sqrt{50} = \sqrt{25 \cdot 2} = \boxed{5\sqrt{2}}",
}


def policy_rules(replies: dict) -> list[dict]:
    return answer_rules(replies, name_prefix="policy: ")


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("math_with_judge", tmp_path, script=policy_rules(POLICY))
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert [r["library_reward"] for r in rows] == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert [r["extracted_answer"] for r in rows] == ["7/8", "7", "x**2 + 4*x + 4", "8", "5*sqrt(2)"]
    assert all(r["judge_evaluations"] is None and r["math_verify_timed_out"] is False for r in rows)
    assert rows[2]["expected_answer"] == r"\(x^2 + 4x + 4\)"  # echoed as given


def test_examples_with_the_judge_over_http(tmp_path):
    replies = {
        **POLICY,
        "2x + 6 = 20": r"x = \boxed{8}",  # wrong; the judge agrees once, then not when the answers are swapped
        "divisors does 36": "The divisors are 1, 2, 3, 4, 6, 9, 12, 18 and 36: nine of them.",  # right, in words
    }
    judge = [
        rule(
            "Both give the value of x. [[A=B]]",
            name="judge: x=8 as B",
            last_user_regex=r"<answer_a>\n7\n</answer_a>",
        ),
        rule(
            "Answer A says 8, answer B says 7. [[A!=B]]",
            name="judge: x=8 as A",
            last_user_regex=r"<answer_b>\n7\n</answer_b>",
        ),
        rule("Nine divisors in both. [[A=B]]", name="judge: nine", last_user_contains="nine of them"),
    ]
    rows = collect_examples_e2e(
        "math_with_judge",
        tmp_path,
        script=judge + policy_rules(replies),
        extra_overrides=["+math_with_judge.resources_servers.math_with_judge.should_use_judge=true"],
    )
    assert [r["reward"] for r in rows] == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert [r["library_reward"] for r in rows] == [1.0, 0.0, 1.0, 0.0, 1.0]
    # The judge is asked only where math-verify said "not equal".
    assert [r["judge_evaluations"] is None for r in rows] == [True, False, True, False, True]
    swap_failed, nine = rows[1]["judge_evaluations"], rows[3]["judge_evaluations"]
    assert [e["verdict_label"] for e in swap_failed] == ["[[A=B]]", "[[A!=B]]"]
    assert [e["verdict_label"] for e in nine] == ["[[A=B]]", "[[A=B]]"]
    prompt = nine[0]["responses_create_params"]["input"][-1]["content"]
    assert "<problem>\nHow many positive divisors does 36 have?\n</problem>" in prompt
    assert nine[0]["response"]["output"][-1]["content"][0]["text"] == "Nine divisors in both. [[A=B]]"
