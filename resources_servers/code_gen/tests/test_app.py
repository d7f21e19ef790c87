import asyncio
import json
import os
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from nemo_gym.testing.responses import make_response, reasoning
from nemo_gym.testing.sandbox import requires_root, sandbox_uid_processes
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.code_gen.app import (
    CodeGenResourcesServer,
    CodeGenRunRequest,
    CodeGenVerifyRequest,
    extract_code,
    reasoning_format_violation,
)
from resources_servers.code_gen.harness import (
    call_outputs_match,
    parse_call_arguments,
    parse_call_expected,
    stdio_outputs_match,
)

DATA_PATH = Path(__file__).resolve().parents[1] / "data" / "example.jsonl"
PARAMS = {"input": [{"role": "user", "content": "Read two integers and print their sum."}]}
SUM_TESTS = {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]}
SUM = "a, b = map(int, input().split())\nprint(a + b)"
TWO_SUM_TESTS = {
    "inputs": ["[2, 7, 11, 15]\n9", "[3, 2, 4]\n6", "[3, 3]\n6"],
    "outputs": ["[0, 1]", "[1, 2]", "[0, 1]"],
    "fn_name": "twoSum",
}
TWO_SUM_CLASS = """
class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return (seen[target - x], i)   # a tuple compares like a list
            seen[x] = i
"""

def new_server(**config) -> CodeGenResourcesServer:
    config.setdefault("use_ray", False)
    config.setdefault("num_processes", 2)
    return make_server(CodeGenResourcesServer, name="code_gen", domain="coding", **config)


def fenced(code: str, before: str = "Here is my solution.") -> str:
    return f"{before}\n```python\n{code}\n```\n"


VERIFY = Verifier(new_server, CodeGenVerifyRequest, PARAMS)


def request(*output, unit_tests=None) -> CodeGenVerifyRequest:
    return VERIFY.request(*output, verifier_metadata={"unit_tests": unit_tests or SUM_TESTS})


def verify(*output, unit_tests=None, server=None, **config):
    return VERIFY.run(request(*output, unit_tests=unit_tests), server or new_server(**config))


# ------------------------------------------------------------------------------------------------ extraction


def test_code_is_between_the_last_two_fence_lines():
    text = "Idea:\n```\nnot this\n```\nFinal:\n```python\nprint(1)\nprint(2)\n```\nDone."
    assert extract_code(text) == "print(1)\nprint(2)"


def test_fewer_than_two_fence_lines_means_no_code():
    assert extract_code("print(1)") is None
    assert extract_code("```python\nprint(1)") is None


def test_fence_lines_are_whole_lines_even_with_text_around_the_backticks():
    # The reference's rule: a line *containing* ``` is a fence, so an odd number of fences pairs the last two.
    assert extract_code("a ```python\nx = 1\nb ``` c") == "x = 1"
    assert extract_code("```\nfirst\n```\nsecond\n```") == "second"
    assert extract_code("```python\n```") == ""


def test_reasoning_format_violation_rules():
    assert not reasoning_format_violation(make_response("plain answer"))
    assert reasoning_format_violation(make_response("<think>oops</think> answer"))
    assert reasoning_format_violation(make_response("answer </think>"))
    assert not reasoning_format_violation(make_response(reasoning("<think>one block</think>"), "answer"))
    assert reasoning_format_violation(make_response(reasoning("<think>a</think><think>b"), "answer"))
    assert reasoning_format_violation(make_response(reasoning("a</think> b</think>"), "answer"))


# ---------------------------------------------------------------------------------------------- judging rules


def test_stdio_comparison():
    assert stdio_outputs_match("3\n", "3")
    assert stdio_outputs_match("  1 2  \n3\n\n", "1 2\n3")  # whitespace around lines and the output
    assert not stdio_outputs_match("1 2\n\n3", "1 2\n3")  # an empty line inside is a line
    assert stdio_outputs_match("1.50 2\n", "1.5 2.0")
    assert not stdio_outputs_match("1 2\n", "1 2 3")
    assert not stdio_outputs_match("1\n2\n", "1 2")
    assert not stdio_outputs_match("YES", "yes")
    assert not stdio_outputs_match("", "0")


def test_call_arguments_and_expected_values():
    assert parse_call_arguments('[1, 2]\n"x"\n') == [[1, 2], "x"]
    assert parse_call_arguments([[1, 2], "x"]) == [[1, 2], "x"]
    with pytest.raises(ValueError):
        parse_call_arguments("not json")
    assert parse_call_expected("[0, 1]") == [0, 1]
    assert parse_call_expected('"abc"') == "abc"
    assert parse_call_expected("abc") == "abc"  # not JSON: taken literally
    assert parse_call_expected(5) == 5
    assert call_outputs_match("[0, 1]", (0, 1))
    assert call_outputs_match("1.0", 1)
    assert not call_outputs_match("[1, 0]", [0, 1])
    assert not call_outputs_match(None, 1)
    assert not call_outputs_match("{bad", 1)


# ------------------------------------------------------------------------------------------ golden verifies


def test_correct_program_passes_every_test():
    result = verify(fenced(SUM))
    assert result.reward == 1.0
    assert result.result == [True, True, True]
    assert result.extracted_model_code == SUM
    assert result.extracted_model_output == fenced(SUM)
    assert result.metadata["num_tests"] == 3 and result.metadata["executor"] == "local"
    assert result.unit_tests_time_taken > 0
    assert result.reasoning_format_violation_rate == 0.0


def test_wrong_answer_stops_at_the_first_failure():
    result = verify(fenced("a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)"))
    assert result.reward == 0.0
    assert result.result == [True, -2]  # the third test never ran
    assert result.metadata["error_code"] == -2 and result.metadata["error_message"] == "Wrong Answer"
    assert result.metadata["test_index"] == 1
    assert result.metadata["output"] == "0\n" and result.metadata["expected"] == "7\n"


def test_runtime_error():
    result = verify(fenced("a, b = map(int, input().split())\nprint(a // (b - 2))"))
    assert result.reward == 0.0
    assert result.result == [-4]
    assert result.metadata["error_message"] == "Runtime Error"
    assert "ZeroDivisionError" in result.metadata["error"]
    assert "driver.py" not in result.metadata["error"]  # only the program's own frames


def test_nonzero_exit_is_a_runtime_error_and_exit_zero_is_fine():
    assert verify(fenced("import sys\nsys.exit(3)")).result == [-4]
    assert verify(fenced(SUM + "\nexit()")).result == [True, True, True]  # exit() works without `site`


def test_time_limit():
    result = verify(fenced("a, b = map(int, input().split())\nwhile a > 5:\n    pass\nprint(a + b)"),
                    unit_test_timeout_secs=1)
    assert result.reward == 0.0
    assert result.result == [True, -3]
    assert result.metadata["error_message"] == "Time Limit Exceeded"
    assert result.metadata["test_index"] == 1


def test_compilation_error():
    result = verify(fenced("def broken(:\n    pass"))
    assert result.reward == 0.0
    assert result.result == [-4]
    assert result.metadata["error_message"] == "Compilation Error"
    assert "SyntaxError" in result.metadata["error"]


def test_no_code_block_scores_zero_and_runs_nothing():
    result = verify("I would add the two numbers: print(a + b)")
    assert result.reward == 0.0
    assert result.extracted_model_output == "I would add the two numbers: print(a + b)"
    assert result.extracted_model_code is None and result.result is None and result.metadata is None
    assert result.unit_tests_time_taken is None


def test_single_fence_and_empty_output_score_zero():
    assert verify("```python\n" + SUM).reward == 0.0
    empty = verify()
    assert empty.reward == 0.0 and empty.extracted_model_output == "" and empty.result is None
    assert verify(reasoning("```python\nprint(3)\n```")).reward == 0.0  # reasoning is not the answer


def test_reasoning_format_penalty():
    result = verify(fenced(SUM, before="<think>the sum</think>"))
    assert result.result == [True, True, True]  # correct, but the format is broken
    assert result.reward == -0.2
    assert result.reasoning_format_violation_rate == 1.0
    doubled = verify(reasoning("<think>a</think> <think>b</think>"), fenced(SUM), reasoning_format_penalty=-0.5)
    assert doubled.reward == -0.5 and doubled.reasoning_format_violation_rate == 1.0
    fine = verify(reasoning("<think>one block</think>"), fenced(SUM))
    assert fine.reward == 1.0 and fine.reasoning_format_violation_rate == 0.0


def test_call_based_with_a_solution_class():
    result = verify(fenced(TWO_SUM_CLASS), unit_tests=TWO_SUM_TESTS)
    assert result.reward == 1.0 and result.result == [True, True, True]


def test_call_based_with_a_top_level_function_and_list_arguments():
    tests = {"inputs": [[[1, 2, 3]], [[]]], "outputs": [6, "0"], "fn_name": "total"}
    assert verify(fenced("def total(xs):\n    return sum(xs)"), unit_tests=tests).result == [True, True]


def test_call_based_failures():
    wrong = verify(fenced("def twoSum(nums, target):\n    return [0, 1]"), unit_tests=TWO_SUM_TESTS)
    assert wrong.result == [True, -2] and wrong.metadata["output"] == "[0, 1]"
    missing = verify(fenced("def something_else():\n    pass"), unit_tests=TWO_SUM_TESTS)
    assert missing.result == [-4] and "twoSum" in missing.metadata["error"]
    unserializable = verify(fenced("def twoSum(nums, target):\n    return {0, 1}"), unit_tests=TWO_SUM_TESTS)
    assert unserializable.result == [-4] and "JSON" in unserializable.metadata["error"]
    exits = verify(fenced("def twoSum(nums, target):\n    raise SystemExit(0)"), unit_tests=TWO_SUM_TESTS)
    assert exits.result == [-4]


def test_printing_in_call_based_code_is_ignored():
    code = (
        "def twoSum(nums, target):\n    print('debug', nums)\n"
        "    return [0, 1] if target != 6 or nums[0] == 3 and nums[1] == 3 else [1, 2]"
    )
    assert verify(fenced(code), unit_tests=TWO_SUM_TESTS).result == [True, True, True]


def test_invalid_unit_tests_are_a_global_failure():
    bad = verify(fenced(SUM), unit_tests={"inputs": ["1 2\n"], "outputs": []})
    assert bad.reward == 0.0 and bad.result == [-1] and bad.metadata["error_code"] == -1
    bad_tests = {"inputs": ["{nope"], "outputs": ["1"], "fn_name": "f"}
    bad_json = verify(fenced("def f(x):\n    return x"), unit_tests=bad_tests)
    assert bad_json.result == [-1] and "invalid unit test" in bad_json.metadata["error"]


def test_output_limit_is_a_runtime_error():
    result = verify(fenced("while True:\n    print('y' * 1000)"), max_output_mb=0.1)
    assert result.result == [-4] and "output limit" in result.metadata["error"]


def test_unit_tests_may_be_json_text():
    body = VERIFY.request(fenced(SUM), verifier_metadata={"unit_tests": json.dumps(SUM_TESTS)})
    assert body.verifier_metadata.unit_tests.inputs == SUM_TESTS["inputs"]
    assert VERIFY.run(body).reward == 1.0


def test_request_fields_are_echoed():
    body = request(fenced(SUM))
    body = CodeGenVerifyRequest.model_validate(
        {**body.model_dump(), "verifier_metadata": {"unit_tests": SUM_TESTS, "problem_id": "p-1"}}
    )
    result = VERIFY.run(body)
    assert result.verifier_metadata.unit_tests.inputs == SUM_TESTS["inputs"]
    assert result.verifier_metadata.model_dump()["problem_id"] == "p-1"
    assert result.model_dump()["responses_create_params"]["input"][0]["content"] == PARAMS["input"][0]["content"]


def test_a_harness_failure_is_a_global_failure_not_a_crash(monkeypatch):
    import resources_servers.code_gen.app as app_module

    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(app_module, "run_unit_tests", explode)
    result = verify(fenced(SUM))
    assert result.reward == 0.0 and result.result == [-1, -1, -1] and "boom" in result.metadata["error"]


# ------------------------------------------------------------------------------------------- hostile programs

ESCAPE_PATHS = [
    f"{directory}/code_gen_escape"
    for directory in ("/tmp", "/var/tmp", "/dev/shm", "/root", "/etc", str(Path.cwd()), "..")
]
HOSTILE = {
    "loops forever": "while True:\n    pass",
    "sleeps forever": "import time\ntime.sleep(3600)",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "allocates without bound": "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))",
    "writes outside its directory": (  # tries every path; printing nothing is then a wrong answer
        "for path in " + repr(ESCAPE_PATHS) + ":\n"
        "    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass"
    ),
    "opens a socket": "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2)\nprint(3)",
    "leaves a background process": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3600)\n"
        "print(int(input().split()[0]) + 100)"
    ),
}


@requires_root
def test_hostile_programs_are_stopped_and_scored_zero_while_the_server_keeps_serving(tmp_path):
    import socket as socket_module

    listener = socket_module.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    listener.settimeout(0.0)
    server = new_server(unit_test_timeout_secs=2, max_processes=8, memory_limit_mb=256, num_processes=2)
    try:
        with TestClient(server.build_app()) as client:
            for name, code in HOSTILE.items():
                body = request(fenced(code.replace("PORT", str(port)))).model_dump(mode="json")
                started = time.monotonic()
                response = client.post("/verify", json=body)
                assert response.status_code == 200, name
                result = response.json()
                assert result["reward"] == 0.0, name
                assert result["result"][-1] in (-2, -3, -4), (name, result["result"], result["metadata"])
                assert time.monotonic() - started < 30, name
                # The server is still fine: a normal request right after succeeds.
                ok = client.post("/verify", json=request(fenced(SUM)).model_dump(mode="json")).json()
                assert ok["reward"] == 1.0, (name, ok["metadata"])
        for path in ESCAPE_PATHS[:-1]:
            assert not os.path.exists(path)
        assert not list(Path("/tmp/nemo_gym_sandbox").glob("*/code_gen_escape"))
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever connected
        deadline = time.monotonic() + 5
        while sandbox_uid_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sandbox_uid_processes() == []  # the fork bomb, the sleeper and the setsid child are all gone
    finally:
        listener.close()


@requires_root
def test_the_specific_verdicts_of_hostile_programs():
    server = new_server(unit_test_timeout_secs=1, max_processes=8, memory_limit_mb=256)
    loop = verify(fenced(HOSTILE["loops forever"]), server=server)
    assert loop.result == [-3]
    memory = verify(fenced(HOSTILE["allocates without bound"]), server=server)
    assert memory.result == [-4] and "MemoryError" in memory.metadata["error"]
    writes = verify(fenced("open('/tmp/code_gen_escape', 'w')"), server=server)
    # /tmp is in the view only as the (read-only) way to the scratch directory; /etc is not in it at all.
    assert writes.result == [-4] and "Read-only file system" in writes.metadata["error"]
    assert verify(fenced("open('/etc/code_gen_escape', 'w')"), server=server).metadata["error"].endswith(
        "No such file or directory: '/etc/code_gen_escape'"
    )
    sock = verify(fenced(HOSTILE["opens a socket"].replace("PORT", "9")), server=server)
    # The namespace backend leaves loopback down; bwrap brings up a private one with nothing listening.
    assert sock.result == [-4] and (
        "Network is unreachable" in sock.metadata["error"] or "Connection refused" in sock.metadata["error"]
    )
    background = verify(fenced(HOSTILE["leaves a background process"]), server=server)
    assert background.result == [-2]  # it printed a wrong number, and its child did not outlive the test


@requires_root
def test_program_sees_an_isolated_world():
    # /tmp shows only the scratch dir, plus the interpreter's own install tree when that lives under /tmp (a venv
    # there is mounted back read-only so Python can run).
    import sys

    interpreter_dirs = sorted(
        {Path(p).parts[2] for p in (sys.prefix, sys.base_prefix) if Path(p).parts[:2] == ("/", "tmp") and len(Path(p).parts) > 2}
    )
    probe = (
        "import os, sys\n"
        f"others = {interpreter_dirs!r}\n"
        "print(os.getuid() != 0, sorted(os.environ) == ['HOME', 'LANG', 'PATH'], os.environ['HOME'] == os.getcwd(),\n"
        "      sys.flags.isolated == 1, sorted(os.listdir('/tmp')) == sorted([os.getcwd().split('/')[2]] + others),\n"
        "      not os.path.exists(" + repr(str(DATA_PATH)) + "), open('f', 'w').write('ok') == 2)"
    )
    tests = {"inputs": [""], "outputs": ["True True True True True True True"]}
    result = verify(fenced(probe), unit_tests=tests)
    assert result.result == [True], result.metadata


async def test_the_event_loop_keeps_serving_while_a_program_runs():
    server = new_server(unit_test_timeout_secs=3, num_processes=2)
    app = server.build_app()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        slow_body = request(fenced("while True:\n    pass")).model_dump(mode="json")
        slow = asyncio.create_task(client.post("/verify", json=slow_body))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        health = await client.get("/health")
        assert health.status_code == 200 and time.monotonic() - started < 1.0
        quick = await client.post("/verify", json=request(fenced(SUM)).model_dump(mode="json"))
        assert quick.json()["reward"] == 1.0
        assert not slow.done()  # the looping program is still being timed out
        assert (await slow).json()["result"] == [-3]


# ------------------------------------------------------------------------------------------------ examples


REFERENCE_SOLUTIONS = [
    "print(sum(ch in 'aeiouAEIOU' for ch in input()))",
    "input()\nvalues = sorted(set(map(int, input().split())))\nprint(values[-2] if len(values) > 1 else -1)",
    "print(' '.join(reversed(input().split())))",
    "def is_balanced(s):\n    stack, pairs = [], {')': '(', ']': '[', '}': '{'}\n    for ch in s:\n"
    "        if ch in '([{':\n            stack.append(ch)\n        elif ch in pairs:\n"
    "            if not stack or stack.pop() != pairs[ch]:\n                return False\n    return not stack",
    "class Solution:\n    def longestRun(self, s: str, k: int) -> List[int]:\n        best, i = [0, -1], 0\n"
    "        while i < len(s):\n            j = i\n"
    "            while j < len(s) and s[j] == s[i]:\n                j += 1\n"
    "            if j - i >= k and j - i > best[0]:\n                best = [j - i, i]\n            i = j\n"
    "        return best",
]


def test_example_rows_validate_and_cover_both_modes():
    rows = example_rows(__file__)
    assert len(rows) == 5
    modes = set()
    for row in rows:
        parsed = CodeGenRunRequest.model_validate(row)
        tests = parsed.verifier_metadata.unit_tests
        assert len(tests.inputs) == len(tests.outputs) >= 3
        modes.add("call" if tests.fn_name else "stdio")
        assert row["agent_ref"]["name"] == "code_gen_simple_agent"
    assert modes == {"call", "stdio"}


def test_example_rows_accept_their_reference_solutions():
    server = new_server()
    for row, solution in zip(example_rows(__file__), REFERENCE_SOLUTIONS):
        result = VERIFY.verify_row(row, fenced(solution), server=server)
        assert result.reward == 1.0, (row["verifier_metadata"]["problem_id"], result.result, result.metadata)
