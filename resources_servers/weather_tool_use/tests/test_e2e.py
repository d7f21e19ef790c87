"""The 5 examples through a real stack (ng_run + ng_collect_rollouts) with the scripted fake LLM: one right answer
per way of failing, so each component is seen at 0 in a real trajectory (the tool's answers come from the real
route)."""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import rule, step, steps_rule, tool_call

SCRIPT = [
    steps_rule("weather in Lisbon", step(tool_call("get_weather", {"city": "Lisbon"})), step("19 °C and sea mist.")),
    rule("Nairobi is sunny today.", name="no tool", last_user_contains="Nairobi"),
    # The wrong city, and an answer that repeats its report.
    steps_rule("Lima", step(tool_call("get_weather", {"city": "Limba"})), step("Report: {{last_tool_output}}")),
    steps_rule("Cairo", step(tool_call("get_weather", {"city": "Cairo"})), step("Have a good trip!")),
    steps_rule("Montreal", step(tool_call("get_weather", {"city": "montreal, Canada"})), step("Blowing snow there.")),
]

COMPONENTS = [  # (called_tool, right_city, used_tool_output) per row
    (1.0, 1.0, 1.0),
    (0.0, 0.0, 0.0),
    (1.0, 0.0, 1.0),
    (1.0, 1.0, 0.0),
    (1.0, 1.0, 1.0),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("weather_tool_use", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [(r["called_tool"], r["right_city"], r["used_tool_output"]) for r in rows] == COMPONENTS
    assert [r["reward"] for r in rows] == [1.0, 0.0, 0.0, 0.0, 1.0]
    for row in rows:
        assert set(row["reward_components"]) == {"called_tool", "right_city", "used_tool_output"}
    assert [r["called_cities"] for r in rows] == [["Lisbon"], [], ["Limba"], ["Cairo"], ["montreal, Canada"]]
    # The tool's answer reached the model: the real route's report, echoed by the scripted answer.
    assert '"city":"Limba"' in rows[2]["response"]["output"][-1]["content"][0]["text"].replace(" ", "")
