"""The 5 examples through a real stack (ng_run + ng_collect_rollouts) with the scripted fake LLM, then the collected
rollouts through this server's `/aggregate_metrics`.

Each scripted answer is good on a different mix of components: perfect; right but without the answer line; right
and formatted but too long; formatted but wrong; hedged (wrong, unformatted, brief).
"""

import json

import httpx
import pytest

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.script import answer_rules
from nemo_gym.testing.servers import make_server
from resources_servers.example_multi_reward.app import ExampleMultiRewardResourcesServer

LONG_ANSWER = (
    "Tom starts with three boxes, and every box holds twenty-four pencils, so he begins with seventy-two pencils in "
    "total. He then gives seventeen of them away to his classmates at school. Taking seventeen away from seventy-two "
    "leaves fifty-five pencils, which he keeps in his desk drawer for later use this term, as he had promised his "
    "teacher today.\nAnswer: 55"
)  # 60 words for a budget of 40: brevity 0.5

POLICY = {
    "muffins": "12 x 7 = 84.\nAnswer: 84",
    "train leaves": "From 09:40 to 11:40 is 120 minutes, and the trip is 25 minutes shorter: 95 minutes.",
    "pencils": LONG_ANSWER,
    "rectangle": "The area is 14 x 9 = 126.\nAnswer: 126",
    "Pens cost": "You can buy about 16 or 17 pens.",
}

COMPONENTS = [  # (correctness, format, brevity) per row
    (1.0, 1.0, 1.0),
    (1.0, 0.0, 1.0),
    (1.0, 1.0, 0.5),
    (0.0, 1.0, 1.0),
    (0.0, 0.0, 1.0),
]


def test_examples_end_to_end(tmp_path):
    assert len(LONG_ANSWER.split()) == 60
    rows = collect_examples_e2e("example_multi_reward", tmp_path, script=answer_rules(POLICY))
    assert len(rows) == 5
    assert [(r["correctness"], r["format"], r["brevity"]) for r in rows] == COMPONENTS
    for row in rows:
        assert row["reward_components"] == {"correctness": row["correctness"], "format": row["format"],
                                            "brevity": row["brevity"]}
    # reward = 1.0 * correctness + 0.5 * format + 0.5 * brevity (the shipped weights)
    assert [r["reward"] for r in rows] == [2.0, 1.5, 1.75, 1.0, 0.5]
    assert [r["extracted_answer"] for r in rows] == ["84", "95", "55", "126", "17"]

    # The collector's aggregate metrics see the components, because they are top-level numbers.
    [entry] = json.loads((tmp_path / "rollouts_aggregate_metrics.json").read_text())
    assert entry["agent_metrics"]["mean/correctness"] == pytest.approx(0.6)
    assert entry["agent_metrics"]["mean/format"] == pytest.approx(0.6)
    assert entry["agent_metrics"]["mean/brevity"] == pytest.approx(0.9)

    # This server's own metrics over the collected rollouts, sent the way the collector sends them.
    stripped = [{k: v for k, v in r.items() if k not in ("response", "responses_create_params")} for r in rows]
    for result, row in zip(stripped, rows):
        result["response"] = {"usage": row["response"]["usage"]}
    server = make_server(ExampleMultiRewardResourcesServer, name="example_multi_reward", domain="math")
    with live_server(server.build_app()) as url:
        answer = httpx.post(url + "/aggregate_metrics", json={"verify_responses": stripped}, timeout=30)
    assert answer.status_code == 200, answer.text
    metrics = answer.json()
    assert metrics["agent_metrics"]["pass@1/correctness"] == pytest.approx(60.0)
    assert metrics["agent_metrics"]["pass@1/brevity"] == pytest.approx(90.0)
    assert metrics["key_metrics"]["pass@1/format"] == pytest.approx(60.0)
    assert metrics["key_metrics"]["majority@1/correctness"] == pytest.approx(60.0)
    assert metrics["key_metrics"]["mean/reward"] == pytest.approx(1.35)
    assert "pass@1/no_answer" not in metrics["key_metrics"]
