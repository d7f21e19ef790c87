"""`ng view` in a real headless browser: rollouts collected by a real stack (`ng_run` + ng_collect_rollouts, the
fake LLM behind openai_model), the viewer started as its own process, Debian's chromium driven by selenium.
Filters the table, opens a rollout and reads its tool call and reward, compares the repeats of a task, draws the
summary, and sees lines appended to the files (a new rollout, a failure) show up without a reload. On a run with
ok, incomplete (max_output_tokens) and failed rollouts, at 1400x900: the status column stays in view, the tab
titles carry the counts of the file, and the outcome words are the collector's; its screenshot is saved as an
artifact (and copied to docs/images/viewer.png with NEMO_GYM_UPDATE_SCREENSHOT=1). The JSON API the page reads is
also checked over plain HTTP, which needs no browser.

Without chromium, chromedriver or selenium the browser test is skipped with a reason that starts with
BROWSER TEST SKIPPED (`.ci/run` looks for it)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from nemo_gym.rollouts.collection import RolloutResult
from nemo_gym.testing.responses import function_call, function_call_output, make_response
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack
from tests.conftest import FIXTURE_STACK, REPO_ROOT, free_port

SKIP = "BROWSER TEST SKIPPED"
NG = [sys.executable, "-m", "nemo_gym.cli"]
COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
WAIT_S = 60  # an upper bound for the browser to show something, never a measured time
TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "description": "add to the counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
        "strict": False,
    }
]


def task(text: str, initial: int, expected: int, **extra) -> dict:
    messages = [{"role": "system", "content": "You keep a counter. Use the tool."}, {"role": "user", "content": text}]
    return {"responses_create_params": {"input": messages, "tools": TOOLS}, "initial_count": initial,
            "expected_count": expected, **extra}  # fmt: skip


def browser_paths() -> tuple[str, str]:
    chromium = os.environ.get("NEMO_GYM_CHROMIUM") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )
    driver = os.environ.get("NEMO_GYM_CHROMEDRIVER") or shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip(f"{SKIP}: selenium is not installed (pip install -e '.[dev]')")
    for name, found in (("chromium", chromium), ("chromedriver", driver)):
        if not found or not os.path.isfile(found):
            pytest.skip(
                f"{SKIP}: {name} not found ({found or 'not on PATH'}); install Debian's packages: "
                "apt-get install -y chromium chromium-driver"
            )
    return chromium, driver


# The mixed run: rules put before collect.jsonl's. `times` makes exactly that many calls answer so, whichever
# repeats they are: a reply cut at max_output_tokens (an incomplete rollout), an HTTP 400 (not retried: with
# +max_attempts=1 a failed rollout).
MIXED_RULES = [
    {"name": "cut-a", "match": {"last_user_contains": "explain-a"}, "times": 2,
     "output": ["Let me explain at length. First, the counter"], "incomplete_details": {"reason": "max_output_tokens"}},
    {"name": "cut-b", "match": {"last_user_contains": "explain-b"}, "times": 1,
     "output": ["To begin with, a counter is"], "incomplete_details": {"reason": "max_output_tokens"}},
    {"name": "crash-a", "match": {"last_user_contains": "crash-a"}, "times": 1, "status": 400,
     "error_message": "the backend refused the request"},
    {"name": "crash-b", "match": {"last_user_contains": "crash-b"}, "times": 1, "status": 400,
     "error_message": "the backend refused the request"},
]  # fmt: skip
MIXED_TASKS = [  # 10 tasks x 4 repeats: 3 incomplete, 2 failed, 35 ok
    ("please add 2", 1, 3), ("please add 1", 0, 5), ("this one is broken", 5, 5), ("please add 1", 2, 3),
    ("please add 2 and explain-a at length", 0, 2), ("please add 1, crash-a now and then", 4, 5),
    ("please add 1", 4, 5), ("please add 2", 0, 3), ("please add 1 and explain-b at length", 0, 1),
    ("please add 2, crash-b now and then", 1, 3),
]  # fmt: skip


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> dict:
    """Two runs of the real collector on one stack. `plain`: 4 tasks x 2 repeats, two agents, rewards 1 and 0, a
    tool call in each, one malformed. `mixed`: 10 tasks x 4 repeats with incomplete and failed rollouts
    (`MIXED_RULES`), and what the collector printed (`mixed_output`)."""
    browser_paths()  # no browser: skip before starting a stack for nothing
    work = tmp_path_factory.mktemp("viewer")
    tasks = [
        task("please add 2", 1, 3),  # reward 1
        task("please add 1", 0, 5),  # reward 0
        task("this one is broken", 5, 5),  # malformed tool arguments, reward 1
        task("please add 1", 2, 3, agent_ref={"type": "responses_api_agents", "name": "other_counter_agent"}),
    ]
    (work / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (work / "mixed_tasks.jsonl").write_text("".join(json.dumps(task(*t)) + "\n" for t in MIXED_TASKS))
    script = work / "script.jsonl"
    rules = (FIXTURE_STACK / "scripts" / "collect.jsonl").read_text()
    script.write_text("".join(json.dumps(r) + "\n" for r in MIXED_RULES) + rules)
    output, mixed = work / "out" / "rollouts.jsonl", work / "mixed" / "rollouts.jsonl"
    with FakeLLMBackend("--script", str(script)) as backend:
        head_port = free_port()
        stack = NgRunStack(
            [
                "+config_paths=[configs/collect.yaml]", f"+policy_base_url={backend.base_url}",
                "+policy_api_key=dummy", "+policy_model_name=fake-model", f"+head_server.port={head_port}",
            ],
            cwd=FIXTURE_STACK,
        )  # fmt: skip
        try:
            stack.wait_for("All 4 / 4 servers ready!", timeout=300)

            def collect(tasks_file: str, out: Path, repeats: int, *extra: str) -> ChildProcess:
                return ChildProcess(
                    [
                        *COLLECT, f"+head_server.port={head_port}", "+agent_name=counter_simple_agent",
                        f"+input_jsonl_fpath={work / tasks_file}", f"+output_jsonl_fpath={out}",
                        f"+num_repeats={repeats}", "+progress_bar=false", *extra,
                    ],
                    cwd=work,
                )  # fmt: skip

            plain = collect("tasks.jsonl", output, 2)
            assert plain.wait(timeout=300) == 0, plain.output
            run = collect("mixed_tasks.jsonl", mixed, 4, "+max_attempts=1")
            assert run.wait(timeout=300) == 1, run.output  # some rollouts failed
        finally:
            stack.stop(timeout=60)
    assert len(output.read_text().splitlines()) == 8
    return {"plain": output, "mixed": mixed, "mixed_output": run.output}


@pytest.fixture(scope="module")
def rollouts(collected) -> Path:
    return collected["plain"]


@pytest.fixture
def viewer(rollouts, tmp_path):
    """`ng view FILE --no-browser` as a child process; yields its URL."""
    port = free_port()
    proc = ChildProcess(
        [*NG, "view", str(rollouts), "--no-browser", "--port", str(port), "--refresh-s", "0.2"],
        env={"NEMO_GYM_VIEW_CACHE": str(tmp_path / "cache")},
        name="ng view",
    )
    try:
        proc.wait_for("Viewer: http://", timeout=60)
        url = re.search(r"Viewer: (http://\S+)", proc.output).group(1)
        assert url == f"http://127.0.0.1:{port}/"
        proc.wait_http_ok(url + "api/status", timeout=60)
        yield url
    finally:
        assert proc.stop() in (0, 130), proc.output


@pytest.fixture
def browser():
    chromium, driver_path = browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="ng-view-chromium-")
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={profile}", "--window-size=1600,950",
    ):  # fmt: skip
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    except Exception as exc:  # an installed browser that cannot start here (missing libraries, ...)
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"{SKIP}: chromium did not start: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_view_refuses_a_missing_file_and_names_it(tmp_path):
    missing = tmp_path / "nope.jsonl"
    proc = ChildProcess([*NG, "view", str(missing), "--no-browser"], name="ng view")
    assert proc.wait(timeout=60) == 2
    assert f"error: ng_view: Rollout file not found: {missing} (+input_jsonl_fpath)" in proc.output


def test_the_api_over_http_and_live_growth(tmp_path):
    """The JSON API the page reads, from `ng view` as a process (runs without a browser too)."""
    path = tmp_path / "rollouts.jsonl"
    lines = []
    for t, rewards in enumerate([[1.0, 0.0], [0.5, 0.25]]):
        for r, reward in enumerate(rewards):
            response = make_response(function_call("lookup", {"q": f"q{t}"}), function_call_output("found"), "ok")
            row = {**task(f"question {t}", 0, 0), "_ng_task_index": t, "_ng_rollout_index": r, "reward": reward,
                   "agent_ref": {"name": "agent_a"}, "response": response.model_dump(mode="json")}  # fmt: skip
            lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with ChildProcess(
        [*NG, "view", str(path), "--no-browser", "--port", str(port), "--refresh-s", "0.1"],
        env={"NEMO_GYM_VIEW_CACHE": str(tmp_path / "cache")},
        name="ng view",
    ) as proc:
        proc.wait_http_ok(url + "api/status", timeout=60)
        assert "/static/app.js" in httpx.get(url).text
        page = httpx.get(url + "api/rows", params={"sort": "reward", "desc": "true"}).json()
        assert [r["reward"] for r in page["rows"]] == [1.0, 0.5, 0.25, 0.0]
        assert httpx.get(url + "api/rows", params={"sort": "nope"}).status_code == 400
        best = page["rows"][0]
        assert httpx.get(url + f"api/raw/0/{best['id']}").content == lines[0].encode()
        one = httpx.get(url + f"api/rollout/0/{best['id']}").json()
        assert one["info"]["tool_calls"] == 1 and one["row"]["response"]["output"][0]["name"] == "lookup"
        assert httpx.get(url + "api/rollout/0/999").status_code == 404
        repeats = httpx.get(url + "api/task/0/1").json()
        assert [r["info"]["reward"] for r in repeats["rows"]] == [0.5, 0.25]
        assert httpx.get(url + "api/summary").json()["agents"][0]["pass_at_k"][0]["value"] == 0.25
        assert httpx.get(url + "api/rows", params={"q": "QUESTION 1"}).json()["total"] == 2

        version = httpx.get(url + "api/status").json()["version"]
        with open(path, "a") as f:
            f.write(lines[0].replace('"_ng_task_index": 0', '"_ng_task_index": 2') + "\n")

        def grown() -> bool:
            status = httpx.get(url + "api/status").json()
            return status["version"] != version and status["files"][0]["rollouts"] == 5

        deadline = time.monotonic() + WAIT_S  # an upper bound for the watcher to notice, not a measured time
        while not grown():
            assert time.monotonic() < deadline, f"the new line never showed up\n{proc.output}"
            time.sleep(0.05)
        assert httpx.get(url + "api/rows", params={"q": "question 0"}).json()["total"] == 3  # the search grew too


def test_numbers_the_api_cannot_use_are_422_naming_the_parameter(tmp_path):
    """NaN or an infinity where a reward is compared, an id beyond SQLite's integers: a 422 naming the parameter,
    never a 500 (`ng view` as a process, no browser)."""
    path = tmp_path / "rollouts.jsonl"
    row = {**task("question", 0, 0), "_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}
    path.write_text(json.dumps(row) + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/"
    big = str(2**64)
    with ChildProcess(
        [*NG, "view", str(path), "--no-browser", "--port", str(port)],
        env={"NEMO_GYM_VIEW_CACHE": str(tmp_path / "cache")},
        name="ng view",
    ) as proc:
        proc.wait_http_ok(url + "status", timeout=60)
        refused = {
            "summary?threshold=NaN": "threshold", "summary?threshold=inf": "threshold",
            "rows?min_reward=nan": "min_reward", "rows?max_reward=-Infinity": "max_reward",
            f"rollout/0/{big}": "row_id", f"raw/0/{big}": "row_id", f"rollout/{big}/0": "file",
            f"task/0/{big}": "task", f"rows?task={big}": "task", f"rows?file={big}": "file",
            f"rows?offset={big}": "offset", f"failures?offset={big}": "offset", "rollout/0/-1": "row_id",
        }  # fmt: skip
        for query, parameter in refused.items():
            answer = httpx.get(url + query)
            assert answer.status_code == 422, (query, answer.status_code, answer.text, proc.tail())
            assert [error["loc"][-1] for error in answer.json()["detail"]] == [parameter], (query, answer.text)
        assert httpx.get(url + "summary", params={"threshold": "0.5"}).status_code == 200  # a number is fine
        assert httpx.get(url + "rollout/0/999").status_code == 404  # an id that fits but is not there
        assert "Traceback" not in proc.output


def test_viewer_in_a_real_browser(rollouts, viewer, browser, tmp_path):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def wait(condition, what: str):
        try:
            return WebDriverWait(browser, WAIT_S).until(lambda _: condition())
        except TimeoutException:
            browser.save_screenshot(str(tmp_path / "failure.png"))
            body = browser.find_element(By.TAG_NAME, "body").text
            shot = tmp_path / "failure.png"
            raise AssertionError(f"the page never showed {what} (screenshot {shot}):\n{body}") from None

    def css(selector: str):
        return browser.find_elements(By.CSS_SELECTOR, selector)

    def table_total() -> str:
        return css("#page-info")[0].get_attribute("data-total") or ""

    def choose(selector: str, value: str) -> None:
        from selenium.webdriver.support.ui import Select

        Select(css(selector)[0]).select_by_value(value)

    browser.get(viewer)
    wait(lambda: len(css("tr.rollout-row")) == 8, "the 8 rollouts")
    assert "rollouts.jsonl" in css("#files")[0].text
    assert css("#outcomes")[0].text == "8 rollouts: 8 ok, 0 incomplete, 0 failed"
    assert [css(f"#count-{t}")[0].text for t in ("rollouts", "incomplete", "failed")] == ["8", "0", "0"]

    # Filter: reward at most 0 -> the two rollouts of "please add 1" with the wrong expected count.
    css("#f-max")[0].send_keys("0")
    wait(lambda: table_total() == "2", "2 rollouts with reward <= 0")
    rows = css("tr.rollout-row")
    assert all("please add 1" in r.text for r in rows)
    rows[0].click()
    detail = wait(lambda: (css("#detail .tool-call") or [None])[0] and css("#detail")[0], "the rollout's tool call")
    assert css("#detail .tool-name")[0].text == "increment_counter"
    assert json.loads(css("#detail .tool-args")[0].text) == {"count": 1}
    assert json.loads(css("#detail .tool-output")[0].text) == {"count": 1}
    assert css("#detail .rollout-head .reward")[0].text == "0"
    assert "expected_count" in detail.text and "final_count" in detail.text
    assert "You keep a counter. Use the tool." in detail.text  # the system message
    css("#detail .rollout button")[-1].click()  # raw JSON on demand
    wait(lambda: css("#detail pre.raw")[0].is_displayed(), "the raw JSON")
    assert json.loads(css("#detail pre.raw")[0].text)["expected_count"] == 5

    # Text search in the conversations; the malformed tool call says so.
    css("#f-clear")[0].click()
    css("#f-text")[0].send_keys("broken")
    wait(
        lambda: table_total() == "2" and all("this one is broken" in r.text for r in css("tr.rollout-row")),
        "the 2 rollouts that mention 'broken'",
    )
    css("tr.rollout-row")[0].click()
    wait(lambda: "arguments are not valid JSON" in css("#detail")[0].text, "the malformed-arguments tag")
    assert css("#detail .rollout-head .reward")[0].text == "1"
    browser.save_screenshot(str(tmp_path / "viewer_search.png"))

    # The repeats of that task side by side.
    css("#detail .task-button")[0].click()
    wait(lambda: len(css("#repeats .repeat")) == 2, "the 2 repeats of the task")
    assert css("#repeats .repeat .rank")[0].text.lower() == "best"

    # The summary plots are drawn by the page.
    css("button[data-tab=summary]")[0].click()
    wait(lambda: len(css("#charts .chart")) == 4, "4 summary charts")
    assert len(css("#charts .chart svg rect")) >= 2 and css("#charts .chart svg path")  # bars and pass@k lines
    agents = css("#agent-table tbody tr")
    assert sorted(r.text.split()[0] for r in agents) == ["counter_simple_agent", "other_counter_agent"]

    # Live: the collector appends a rollout and a failure; both show up without a reload.
    first = json.loads(rollouts.read_text().splitlines()[0])
    with open(rollouts, "a") as f:
        f.write(json.dumps({**first, "_ng_task_index": 4, "_ng_rollout_index": 0, "reward": 0.25}) + "\n")
    failure = RolloutResult(
        {**{k: v for k, v in first.items() if k not in ("response", "reward")}, "_ng_task_index": 5},
        error_type="HTTPError", message="POST /run on agent `counter_simple_agent` answered HTTP 503: overloaded",
        status_code=503, server="counter_simple_agent", agent_name="counter_simple_agent", attempts=3,
    ).failure_record()  # fmt: skip
    with open(rollouts.with_name("rollouts_failures.jsonl"), "a") as f:
        f.write(json.dumps(failure) + "\n")
    wait(lambda: css("#count-failed")[0].text == "1", "the failed count going to 1")
    assert css("button[data-tab=failures]")[0].text == "Failed 1" and css("button[data-tab=rollouts]")[0].text == "Rollouts 10"
    wait(lambda: css("#charts .chart")[3].find_elements(By.CSS_SELECTOR, "rect"), "the bar of the failure")
    css("button[data-tab=failures]")[0].click()
    wait(lambda: "answered HTTP 503: overloaded" in css("#failures")[0].text, "the failure's message")
    css("button[data-tab=rollouts]")[0].click()
    css("#f-clear")[0].click()
    wait(lambda: table_total() == "10", "9 rollouts and 1 failure in the table")
    choose("#f-status", "failed")
    wait(lambda: table_total() == "1", "only the failed row")
    css("tr.rollout-row")[0].click()
    wait(lambda: "HTTPError" in css("#detail")[0].text, "the failed row's error")

    # Sorted by reward, a rollout with its tool call open: the screenshot.
    choose("#f-status", "")
    wait(lambda: table_total() == "10", "all rows again")
    css("th[data-key=reward]")[0].click()
    wait(lambda: css("th[data-key=reward]")[0].get_attribute("class").count("desc"), "the reward sort")
    wait(lambda: css("tr.rollout-row")[0].find_elements(By.CSS_SELECTOR, "td")[4].text == "1", "the best rows first")
    target = next(r for r in css("tr.rollout-row") if "please add 2" in r.text)
    target.click()
    wait(lambda: css("#detail .tool-output") and "please add 2" in css("#detail")[0].text, "the rollout")

    # Nothing on the page came from anywhere but the viewer.
    origins = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
    )
    assert set(origins) <= {viewer.rstrip("/")}, origins
    # A page of another site that points its name at 127.0.0.1 (DNS rebinding) is refused.
    assert httpx.get(viewer + "api/status", headers={"Host": "attacker.example"}).status_code == 421
    assert httpx.get(viewer + "api/status").status_code == 200

    shot = tmp_path / "viewer.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    print(f"viewer screenshot: {shot}")


@contextlib.contextmanager
def viewing(browser, path: Path, tmp_path: Path):
    """`ng view PATH` as a child process with `browser` on its page; yields (css, wait): elements by CSS selector,
    and a bounded wait for a condition that names what the page should show."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def css(selector: str):
        return browser.find_elements(By.CSS_SELECTOR, selector)

    def wait(condition, what: str):
        try:
            return WebDriverWait(browser, WAIT_S).until(lambda _: condition())
        except TimeoutException:
            raise AssertionError(f"the page never showed {what}:\n{css('body')[0].text}") from None

    port = free_port()
    with ChildProcess(
        [*NG, "view", str(path), "--no-browser", "--port", str(port)],
        env={"NEMO_GYM_VIEW_CACHE": str(tmp_path / "cache")},
        name="ng view",
    ) as proc:
        proc.wait_http_ok(f"http://127.0.0.1:{port}/api/status", timeout=60)
        browser.get(f"http://127.0.0.1:{port}/")
        yield css, wait


def test_reward_components_and_a_judge_failure_in_a_real_browser(browser, tmp_path):
    """A multi-reward rollout shows its `reward_components`; a `judge_failed` failure (the collector keeps the
    agent's answer as `result`) shows its class, message and the episode that was not scored."""
    path = tmp_path / "rollouts.jsonl"
    response = make_response("Answer: 42").model_dump(mode="json")
    scored = {**task("what is 6 x 7?", 0, 0), "_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.5,
              "agent_ref": {"name": "multi_agent"}, "response": response,
              "reward_components": {"correctness": 1.0, "format": 0.5}}  # fmt: skip
    path.write_text(json.dumps(scored) + "\n")
    unscored = {**task("what is 5 x 5?", 0, 0), "_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0,
                "response": make_response("Answer: 25 (judged)").model_dump(mode="json"),
                "_ng_failure_class": "judge_failed", "_ng_failure_judge_error": "HTTPError: judge down"}  # fmt: skip
    failure = {"_ng_task_index": 1, "_ng_rollout_index": 0, "error_type": "judge_failed",
               "message": "agent `multi_agent` answered with failure class `judge_failed`: HTTPError: judge down",
               "status_code": 200, "server": "multi_agent", "agent_name": "multi_agent", "attempts": 3,
               "row": task("what is 5 x 5?", 0, 0), "_ng_failure_class": "judge_failed",
               "_ng_failure_terminal": False, "result": unscored}  # fmt: skip
    (tmp_path / "rollouts_failures.jsonl").write_text(json.dumps(failure) + "\n")

    with viewing(browser, path, tmp_path) as (css, wait):
        wait(lambda: len(css("tr.rollout-row")) >= 1, "the rollouts")
        next(r for r in css("tr.rollout-row") if "6 x 7" in r.text).click()
        wait(lambda: "reward components" in css("#detail")[0].text.lower(), "the reward components")  # CSS capitalises
        detail = css("#detail")[0].text
        assert "correctness" in detail and "format" in detail

        css('#tabs button[data-tab="failures"]')[0].click()
        wait(lambda: "judge_failed" in css("#failures")[0].text, "the judge failure in the failures table")
        next(r for r in css("#failures tbody tr") if "judge_failed" in r.text).click()
        wait(lambda: "Answer: 25 (judged)" in css("#detail")[0].text, "the unscored episode")
        assert "judge down" in css("#detail")[0].text


def test_token_trajectory_column_and_counts_in_a_real_browser(browser, tmp_path):
    """Rollouts with token ids: the table shows each one's drift check (exact / re-tokenized / unusable) and the
    summary counts them, from the same classification as `ng export tokens`."""
    from selenium.webdriver.common.by import By

    def episode(task_index: int, second_prompt: list, flag=None) -> dict:
        call = {**function_call("lookup", {"q": "x"}), "prompt_token_ids": [1, 2], "generation_token_ids": [5],
                "generation_log_probs": [-0.1]}  # fmt: skip
        answer = make_response("ok").model_dump(mode="json")["output"][0]
        answer.update(prompt_token_ids=second_prompt, generation_token_ids=[8], generation_log_probs=[-0.2])
        if flag:
            answer["token_trajectory"] = flag
        response = make_response(call, function_call_output("found"), answer).model_dump(mode="json")
        return {**task(f"question {task_index}", 0, 0), "_ng_task_index": task_index, "_ng_rollout_index": 0,
                "reward": 1.0, "response": response}  # fmt: skip

    path = tmp_path / "rollouts.jsonl"
    rows = [episode(0, [1, 2, 5, 7]), episode(1, [1, 2, 5, 7], "retokenized"), episode(2, [1, 9], "retokenized")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    with viewing(browser, path, tmp_path) as (css, wait):
        wait(lambda: len(css("tr.rollout-row .traj")) == 3, "a trajectory badge on each of the 3 rollouts")
        badges = {r.find_elements(By.CSS_SELECTOR, "td")[1].text: r.find_element(By.CSS_SELECTOR, ".traj").text
                  for r in css("tr.rollout-row")}  # fmt: skip
        assert badges == {"0": "exact", "1": "re-tokenized", "2": "unusable: tokens_not_contiguous"}, badges
        css('#tabs button[data-tab="summary"]')[0].click()
        wait(lambda: css("#trajectories .traj"), "the token trajectory counts")
        counts = [b.text for b in css("#trajectories .traj")]
        assert counts == ["exact 1", "re-tokenized 1", "unusable 1"], counts
        assert "tokens_not_contiguous 1" in css("#trajectories")[0].text
        browser.save_screenshot(str(tmp_path / "viewer_trajectories.png"))
        css('#tabs button[data-tab="rollouts"]')[0].click()
        wait(lambda: len(css("tr.rollout-row .traj")) == 3, "the table again")
        browser.execute_script("document.querySelectorAll('tr.rollout-row')[2].click()")  # the row of task 2
        wait(lambda: css("#detail .rollout-head .traj"), "the badge in the rollout's detail")
        assert css("#detail .rollout-head .traj")[0].text == "unusable: tokens_not_contiguous"
        browser.save_screenshot(str(tmp_path / "viewer_trajectory_rows.png"))


def test_at_1400x900_the_status_stays_in_view_and_the_tabs_count_the_outcomes(collected, browser, tmp_path):
    """A run with ok, incomplete (max_output_tokens) and failed rollouts, in a 1400x900 window: the status column
    is inside the viewport and the table pane (the columns fit; in a narrower window the pane scrolls sideways and
    the status column stays in view), the tab titles carry the counts of the files, the header says what the
    collector said, and incomplete rollouts are amber, not red. The screenshot is docs/images/viewer.png."""
    mixed = collected["mixed"]
    rows = [json.loads(line) for line in mixed.read_text().splitlines()]
    failures = [json.loads(line) for line in mixed.with_name("rollouts_failures.jsonl").read_text().splitlines()]
    # The counts of the files, read here without nemo_gym's classification.
    incomplete = [r for r in rows if r["response"].get("status") == "incomplete"]
    failed = {(f["_ng_task_index"], f["_ng_rollout_index"]) for f in failures}
    ok = len(rows) - len(incomplete)
    assert (ok, len(incomplete), len(failed)) == (35, 3, 2)
    assert all(r["response"]["incomplete_details"] == {"reason": "max_output_tokens"} for r in incomplete)
    assert all(isinstance(r["reward"], float) for r in incomplete)  # verified, kept in the output
    (error_type,) = {f["error_type"] for f in failures}
    sentence = f"40 rollouts: 35 ok, 3 incomplete (max_output_tokens), 2 failed ({error_type})"
    assert sentence + "." in collected["mixed_output"], collected["mixed_output"]  # the collector's summary

    def viewport(width: int, height: int) -> None:  # the page's size exactly (a window's size includes its frame)
        browser.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        )

    viewport(1400, 900)
    with viewing(browser, mixed, tmp_path) as (css, wait):
        assert browser.execute_script("return [window.innerWidth, window.innerHeight]") == [1400, 900]
        wait(lambda: len(css("tr.rollout-row")) == 40, "the 38 rollouts and the 2 failure lines")
        wait(lambda: css("#outcomes")[0].text == sentence, f"the header saying {sentence!r}")
        titles = {b.get_attribute("data-tab"): b.text for b in css("#tabs button") if b.is_displayed()}
        assert titles == {"rollouts": "Rollouts 40", "summary": "Summary", "incomplete": "Incomplete 3",
                          "failures": "Failed 2"}, titles  # fmt: skip

        def status_cells() -> list[dict]:
            return browser.execute_script(
                """const pane = document.querySelector('.table-pane'), p = pane.getBoundingClientRect();
                return [...document.querySelectorAll('tr.rollout-row td.status')].map((td) => {
                  const r = td.getBoundingClientRect();
                  return {left: r.left, right: r.right, paneLeft: p.left, paneRight: p.left + pane.clientWidth,
                          inner: window.innerWidth, status: td.dataset.status, color: getComputedStyle(td).color,
                          fits: pane.scrollWidth <= pane.clientWidth};
                });"""
            )

        cells = status_cells()
        assert sorted({c["status"] for c in cells}) == ["failed", "incomplete", "ok"]
        for c in cells:
            assert c["paneLeft"] <= c["left"] and c["right"] <= c["paneRight"] <= c["inner"], c
        assert all(c["fits"] for c in cells), "the columns do not fit the table pane at 1400 px"
        colors = {c["status"]: c["color"] for c in cells}
        assert colors["incomplete"] == "rgb(183, 121, 31)" and colors["failed"] == "rgb(192, 57, 43)", colors

        # Narrower than the columns: the pane scrolls sideways, the status column stays in it.
        viewport(900, 900)
        browser.execute_script("const p = document.querySelector('.table-pane'); p.scrollLeft = p.scrollWidth;")
        narrow = status_cells()
        assert not narrow[0]["fits"] and browser.execute_script("return document.querySelector('.table-pane').scrollLeft") > 0
        for c in narrow:
            assert c["paneLeft"] <= c["left"] + 1 and c["right"] <= c["paneRight"], c
        viewport(1400, 900)

        css('#tabs button[data-tab="incomplete"]')[0].click()
        wait(lambda: len(css("#incomplete tbody tr")) == 3, "the 3 incomplete rollouts")
        assert all("max_output_tokens" in r.text for r in css("#incomplete tbody tr"))
        assert "count warn" == css("#count-incomplete")[0].get_attribute("class")
        css('#tabs button[data-tab="failures"]')[0].click()
        wait(lambda: len(css("#failures tbody tr")) == 2, "the 2 failed rollouts")
        assert all(error_type in r.text for r in css("#failures tbody tr"))

        # The screenshot: sorted by status (failed, incomplete, ok), an incomplete rollout open.
        css('#tabs button[data-tab="rollouts"]')[0].click()
        css("th[data-key=status]")[0].click()

        def statuses() -> list[str]:  # read in the page: the table may be re-rendered meanwhile
            return browser.execute_script(
                "return [...document.querySelectorAll('tr.rollout-row td.status')].map((td) => td.dataset.status)"
            )

        wait(lambda: statuses()[:3] == ["failed", "failed", "incomplete"], "failed rows first, then incomplete")
        browser.execute_script(f"document.querySelectorAll('tr.rollout-row')[{statuses().index('incomplete')}].click()")
        wait(lambda: css("#detail .warn-box"), "the incomplete rollout's note")
        assert "incomplete: max_output_tokens" in css("#detail .warn-box")[0].text and not css("#detail .error-box")
        shot = tmp_path / "viewer.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        print(f"viewer screenshot: {shot}")
        if os.environ.get("NEMO_GYM_UPDATE_SCREENSHOT") == "1":
            target = REPO_ROOT / "docs" / "images" / "viewer.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, target)

        css("#detail .task-button")[0].click()
        wait(lambda: len(css("#repeats .repeat")) == 4, "the 4 repeats of the task")
        assert css("#task-tab")[0].text == "Repeats 4"
