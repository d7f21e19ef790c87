"""The 5 examples through a real stack (ng_run + ng_collect_rollouts) with the scripted fake LLM.

The judge model server is `policy_model` (the shipped default), so every judge call goes over real HTTP through
`openai_model` to the same fake backend, whose rules answer `[[A=B]]` / `[[A!=B]]` by what the prompt compares.
Judge rules come first: a judge prompt also holds the question the policy rules look for.
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rules, rule

SERVER_KEY = "equivalence_llm_judge.resources_servers.equivalence_llm_judge"

POLICY = {
    "capital city of Australia": "The capital of Australia is Canberra.",
    "symbol Fe": "Fe is the symbol of iron.",
    "Pride and Prejudice": "It was written in 1813 by a famous English novelist.\nAnswer: Charlotte Bronte",  # wrong
    "Berlin Wall": "It came down in November, after weeks of protests.\nAnswer: 1989",
    "largest planet": "Saturn is the largest planet.",  # wrong
}


def judge_rule(answer_b: str, verdict_text: str) -> dict:
    # Rule names go into a response header: no newlines.
    name = f"judge: {answer_b.strip()}"
    return rule(verdict_text, name=name, last_user_regex="<answer_b>\n" + answer_b)


def policy_rules() -> list[dict]:
    return answer_rules(POLICY, name_prefix="policy: ")


JUDGE = [
    judge_rule("The capital of Australia is Canberra", "Both name Canberra. [[A=B]]"),
    judge_rule("Fe is the symbol of iron", "Iron in both. [[A=B]]"),
    judge_rule("Charlotte Bronte", "Different authors. [[A!=B]]"),  # the extracted answer
    judge_rule("It was written in 1813", "Still a different author. [[A!=B]]"),  # the whole answer, second try
    judge_rule("1989\n", "Same year. [[A=B]]"),
    judge_rule("Saturn", "Hard to say."),  # neither label
]


# The reply without a label (Saturn) is scored "not equal" only with `judge_unparseable_verdict: zero` (v0.5's way);
# by default it is a judge failure (tests/test_app.py).
ZERO_FOR_NO_VERDICT = f"++{SERVER_KEY}.judge_unparseable_verdict=zero"


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e(
        "equivalence_llm_judge", tmp_path, script=JUDGE + policy_rules(), extra_overrides=[ZERO_FOR_NO_VERDICT]
    )
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert [r["failure_reason"] for r in rows] == [None, None, "not_equal", None, "no_verdict"]
    assert [len(r["judge_evaluations"]) for r in rows] == [1, 1, 2, 1, 1]
    assert [r["extracted_answer"] for r in rows] == [
        "The capital of Australia is Canberra.",
        "Fe is the symbol of iron.",
        "Charlotte Bronte",  # read by the row's output_regex
        "1989",
        "Saturn is the largest planet.",
    ]
    assert all(r["judge_error"] is None for r in rows)
    prompt = rows[0]["judge_evaluations"][0]["responses_create_params"]["input"][-1]["content"]
    assert "<answer_a>\nCanberra\n</answer_a>" in prompt
    assert rows[0]["uuid"] == "equivalence-example-0"


def test_swap_check_over_http(tmp_path):
    swap = [
        # Rows 1 and 2 of the examples: the judge agrees in both orders for Canberra, only in one order for iron.
        rule("Same city. [[A=B]]", name="swapped: Canberra", last_user_regex="<answer_a>\nThe capital of Australia"),
        rule(
            "A is about a symbol, B is an element name. [[A!=B]]",
            name="swapped: iron",
            last_user_regex="<answer_a>\nFe is the symbol",
        ),
        rule("[[A=B]]", name="swapped: 1989", last_user_regex="<answer_a>\n1989\n"),
    ]
    rows = collect_examples_e2e(
        "equivalence_llm_judge",
        tmp_path,
        script=swap + JUDGE + policy_rules(),
        extra_overrides=[
            f"++{SERVER_KEY}.check_twice_swap=true", f"++{SERVER_KEY}.reward_if_swap_fails=-1.0", ZERO_FOR_NO_VERDICT
        ],
    )
    assert [r["reward"] for r in rows] == [1.0, -1.0, 0.0, 1.0, 0.0]
    assert [r["failure_reason"] for r in rows] == [None, "swap_check_failed", "not_equal", None, "no_verdict"]
    assert [[e["verdict_label"] for e in r["judge_evaluations"]] for r in rows] == [
        ["[[A=B]]", "[[A=B]]"],
        ["[[A=B]]", "[[A!=B]]"],
        ["[[A!=B]]", "[[A!=B]]"],
        ["[[A=B]]", "[[A=B]]"],
        [None],
    ]
