import asyncio

from fastapi.testclient import TestClient
from starlette.requests import Request

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import SESSION_ID_KEY
from nemo_gym.testing.responses import function_call, make_response, message
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.example_session_state_mgmt.app import (
    CounterSeedSessionRequest,
    CounterVerifyRequest,
    ExampleSessionStateMgmtResourcesServer,
    IncrementCounterRequest,
)

PARAMS = {"input": [{"role": "user", "content": "Add 3 to the counter."}]}


def new_server() -> ExampleSessionStateMgmtResourcesServer:
    return make_server(ExampleSessionStateMgmtResourcesServer, name="example_session_state_mgmt", domain="agent")


VERIFY = Verifier(new_server, CounterVerifyRequest, PARAMS)


def session_request(session_id: str) -> Request:
    """A bare request carrying the session the middleware would have decoded from the cookie."""
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "session": {SESSION_ID_KEY: session_id}}
    return Request(scope)


def verify_body(expected_count: int, response: NeMoGymResponse | None = None) -> CounterVerifyRequest:
    response = response or make_response(message("The counter is done."))
    return VERIFY.request(response=response, expected_count=expected_count)


# ----------------------------------------------------------------------------------------------- direct calls


def test_seeded_counter_reaching_the_expected_count_gets_reward_one():
    server = new_server()
    request = session_request("rollout-a")

    async def rollout():
        await server.seed_session(request, CounterSeedSessionRequest(initial_count=10))
        await server.increment_counter(request, IncrementCounterRequest(count=3))
        await server.increment_counter(request, IncrementCounterRequest(count=4))
        assert (await server.get_counter_value(request)).count == 17
        return await server.verify(request, verify_body(17))

    result = asyncio.run(rollout())
    assert result.reward == 1.0
    assert result.final_count == 17
    assert result.expected_count == 17  # echoed


def test_wrong_final_count_gets_reward_zero():
    server = new_server()
    request = session_request("rollout-b")

    async def rollout():
        await server.seed_session(request, CounterSeedSessionRequest(initial_count=2))
        await server.increment_counter(request, IncrementCounterRequest(count=-4))
        return await server.verify(request, verify_body(-3))

    result = asyncio.run(rollout())
    assert result.reward == 0.0 and result.final_count == -2


def test_untouched_session_gets_reward_zero_even_if_zero_was_expected():
    # Like the reference: no state for this rollout means the task was not done.
    result = asyncio.run(new_server().verify(session_request("never-seeded"), verify_body(0)))
    assert result.reward == 0.0 and result.final_count is None


def test_unseeded_counter_starts_at_zero():
    server = new_server()
    request = session_request("rollout-c")

    async def rollout():
        assert (await server.get_counter_value(request)).count == 0
        await server.increment_counter(request, IncrementCounterRequest(count=2))
        return await server.verify(request, verify_body(2))

    assert asyncio.run(rollout()).reward == 1.0


def test_verify_frees_the_session_state():
    server = new_server()
    request = session_request("rollout-d")

    async def rollout():
        await server.seed_session(request, CounterSeedSessionRequest(initial_count=5))
        first = await server.verify(request, verify_body(5))
        second = await server.verify(request, verify_body(5))
        return first, second

    first, second = asyncio.run(rollout())
    assert first.reward == 1.0
    assert second.reward == 0.0 and second.final_count is None
    assert server.session_id_to_counter == {}


def test_verify_reads_state_not_the_transcript():
    # Malformed or misleading model output does not matter: only the counter does.
    server = new_server()
    request = session_request("rollout-e")
    garbage = make_response(
        function_call("increment_counter", "{oops", call_id="c1"),
        message("The counter is 99."),
    )

    async def rollout():
        await server.seed_session(request, CounterSeedSessionRequest(initial_count=7))
        return await server.verify(request, verify_body(7, garbage))

    assert asyncio.run(rollout()).reward == 1.0


def test_seed_request_ignores_other_row_fields():
    row = {"initial_count": 4, "expected_count": 9, "responses_create_params": PARAMS}
    seed = CounterSeedSessionRequest.model_validate(row)
    assert seed.initial_count == 4
    assert CounterSeedSessionRequest.model_validate({}).initial_count == 0


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_sessions_keep_rollouts_apart():
    app = new_server().build_app()
    with TestClient(app) as rollout_a, TestClient(app) as rollout_b:  # each client keeps its own cookie
        assert rollout_a.post("/seed_session", json={"initial_count": 10, "expected_count": 17}).status_code == 200
        assert rollout_b.post("/seed_session", json={"initial_count": 100}).status_code == 200

        assert rollout_a.post("/increment_counter", json={"count": 3}).json() == {"success": True}
        assert rollout_b.post("/increment_counter", json={"count": -1}).json() == {"success": True}
        assert rollout_a.post("/increment_counter", json={"count": 4}).json() == {"success": True}

        # Malformed arguments are rejected with a 422 the model can read, and change nothing.
        bad = rollout_a.post("/increment_counter", json={"count": "many"})
        assert bad.status_code == 422

        assert rollout_a.post("/get_counter_value", json={}).json() == {"count": 17}
        assert rollout_b.post("/get_counter_value", json={}).json() == {"count": 99}

        body = VERIFY.body(message("The counter is 17."), expected_count=17)
        verified = rollout_a.post("/verify", json=body)
        assert verified.status_code == 200
        assert verified.json()["reward"] == 1.0 and verified.json()["final_count"] == 17

        verified_b = rollout_b.post("/verify", json=body)
        assert verified_b.json()["reward"] == 0.0 and verified_b.json()["final_count"] == 99

    # A caller without the cookie is a different rollout and sees none of that state.
    with TestClient(app) as stranger:
        assert stranger.post("/get_counter_value", json={}).json() == {"count": 0}


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate():
    rows = example_rows(__file__)
    assert len(rows) == 5
    for row in rows:
        VERIFY.row_request(row, message("placeholder"))
        assert "initial_count" in row
        CounterSeedSessionRequest.model_validate(row)


def test_example_rows_are_solvable_over_http():
    app = new_server().build_app()
    placeholder = make_response(message("done")).model_dump(mode="json")
    for row in example_rows(__file__):
        with TestClient(app) as client:
            client.post("/seed_session", json=row)
            client.post("/increment_counter", json={"count": row["expected_count"] - row["initial_count"]})
            verified = client.post("/verify", json={**row, "response": placeholder})
            assert verified.json()["reward"] == 1.0
