"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), with the fake LLM calling get_weather."""

from nemo_gym.testing.e2e import collect_examples_e2e


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("example_single_tool_call", tmp_path, backend_args=["--tool-args", '{"city": "Oslo"}'])
    assert len(rows) == 5
    assert [r["reward"] for r in rows] == [1.0] * 5
    for row in rows:
        types = [item["type"] for item in row["response"]["output"]]
        assert types == ["function_call", "function_call_output", "message"]
        assert "cold" in row["response"]["output"][1]["output"]
