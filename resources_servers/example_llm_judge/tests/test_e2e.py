"""The 5 examples through a real stack (ng_run + ng_collect_rollouts) with the scripted fake LLM.

The judge is `policy_model` (the shipped default), so each judge call goes over real HTTP through `openai_model`
to the same fake backend. Judge rules come first and look for the candidate answer in the judge prompt (a judge
prompt also holds the question the policy rules look for).
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule, answer_rules

POLICY = {
    "capital city of Canada": "Ottawa is the capital of Canada.",
    "millilitres are in one litre": "There are 1,000 mL in a litre.",  # right, in another form than "1000"
    "largest": "Saturn is the largest planet.",  # wrong
    "chemical symbol for gold": "Gold's symbol is Au.",
    "two and a half hours": "It is about 150 minutes, or maybe 120.",  # hedged: the judge gives no verdict
}

JUDGE = [
    answer_rule("Candidate answer: Ottawa is", "Same city.\nVERDICT: CORRECT", name="judge: Ottawa"),
    answer_rule("Candidate answer: There are 1,000 mL", "1,000 mL is 1000.\nVERDICT: CORRECT", name="judge: mL"),
    answer_rule("Candidate answer: Saturn", "Saturn is not Jupiter.\nVERDICT: INCORRECT", name="judge: Saturn"),
    answer_rule("Candidate answer: Gold's symbol", "Both say Au.\nVERDICT: CORRECT", name="judge: Au"),
    answer_rule("Candidate answer: It is about 150", "It names two numbers; I cannot tell.", name="judge: 150"),
]


# Row 5's judge reply holds no verdict: scored 0 only with `judge_unparseable_verdict: zero` (v0.5's way); by
# default it is a judge failure (tests/test_app.py).
ZERO_FOR_NO_VERDICT = "++example_llm_judge.resources_servers.example_llm_judge.judge_unparseable_verdict=zero"


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e(
        "example_llm_judge", tmp_path, script=JUDGE + answer_rules(POLICY, name_prefix="policy: "),
        extra_overrides=[ZERO_FOR_NO_VERDICT],
    )
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert [r["judge_verdict"] for r in rows] == ["correct", "correct", "incorrect", "correct", None]
    assert [r["model_answer"] for r in rows] == list(POLICY.values())
    assert [r["expected_answer"] for r in rows] == ["Ottawa", "1000", "Jupiter", "Au", "150"]
    assert rows[2]["judge_text"] == "Saturn is not Jupiter.\nVERDICT: INCORRECT"
    assert not any("_ng_failure_class" in r for r in rows)


def test_a_judge_failure_is_retried_by_the_collector_not_scored(tmp_path):
    # The judge's backend fails once on row 0: /verify answers `judge_failed` (no retry in the judge's model server,
    # max_attempts=1), the collector reruns the rollout, and the second judge call gives the verdict.
    failing_once = {"name": "judge down once", "match": {"last_user_contains": "Candidate answer: Ottawa is"},
                    "times": 1, "status": 500, "error_message": "scripted: judge backend crashed"}
    rows = collect_examples_e2e(
        "example_llm_judge",
        tmp_path,
        script=[failing_once, *JUDGE, *answer_rules(POLICY, name_prefix="policy: ")],
        extra_overrides=["++policy_model.responses_api_models.openai_model.max_attempts=1", ZERO_FOR_NO_VERDICT],
    )
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert rows[0]["judge_verdict"] == "correct"
    assert [r.get("_ng_attempt_index") for r in rows] == [1, None, None, None, None]  # row 0 ran twice
    assert not any("_ng_failure_class" in r for r in rows)
    assert not (tmp_path / "rollouts_failures.jsonl").exists()
