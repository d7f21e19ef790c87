"""Signed-cookie sessions: cookie format and signing, and the middleware over real HTTP (uvicorn + httpx)."""

from __future__ import annotations

import base64
import json
import os

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request

from nemo_gym.serving import sessions
from nemo_gym.serving.sessions import (
    SESSION_ID_KEY,
    SESSION_SECRET_ENV_VAR_NAME,
    SessionCookieMiddleware,
    decode_session_cookie,
    encode_session_cookie,
    export_session_secret_to_env,
    get_session_secret,
    set_session_secret,
)
from tests.unit.test_server_utils import live_server

SECRET = b"s" * 32
NAME = "MyServer___my_server"


# ------------------------------------------------------------------------------------------------------------
# Cookie format


def test_encode_decode_roundtrip():
    value = encode_session_cookie({"session_id": "abc", "n": 3}, NAME, SECRET)
    assert decode_session_cookie(value, NAME, SECRET) == {"session_id": "abc", "n": 3}
    assert decode_session_cookie(value.encode(), NAME, SECRET) == {"session_id": "abc", "n": 3}
    assert set(value) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")  # cookie-safe


def _tamper_payload(value: str, new_session: dict) -> str:
    _payload, sig = value.rsplit(".", 1)
    forged = base64.urlsafe_b64encode(orjson.dumps(new_session)).rstrip(b"=").decode()
    return f"{forged}.{sig}"


@pytest.mark.parametrize(
    "mangle",
    [
        lambda v: _tamper_payload(v, {"session_id": "someone-else"}),  # payload swapped, signature kept
        lambda v: v[:-2] + ("AA" if not v.endswith("AA") else "BB"),  # signature altered
        lambda v: v.split(".")[0],  # no signature
        lambda v: "." + v.split(".")[1],  # no payload
        lambda v: "",
        lambda v: "garbage",
        lambda v: "!!!.???",
    ],
)
def test_tampered_cookies_are_rejected(mangle):
    value = encode_session_cookie({"session_id": "abc"}, NAME, SECRET)
    assert decode_session_cookie(mangle(value), NAME, SECRET) is None


def test_cookie_is_bound_to_secret_and_cookie_name():
    value = encode_session_cookie({"session_id": "abc"}, NAME, SECRET)
    assert decode_session_cookie(value, NAME, b"t" * 32) is None  # another launch's secret
    assert decode_session_cookie(value, "Other___server", SECRET) is None  # replayed under another name


def test_reference_style_forgery_is_rejected():
    """The reference signs with the cookie name itself; knowing the name must not be enough to forge."""
    from itsdangerous import TimestampSigner

    forged = TimestampSigner(NAME).sign(base64.b64encode(json.dumps({"session_id": "x"}).encode())).decode()
    assert decode_session_cookie(forged, NAME, SECRET) is None


@pytest.mark.parametrize("key_len", [0, 1, 32, 64, 65, 200])
def test_precomputed_hmac_matches_the_standard_library(key_len):
    import hashlib
    import hmac

    key = bytes(range(256))[:key_len] if key_len <= 256 else b""
    mac = sessions._HmacSha256(key)
    for message in (b"", b"x", b"Name___id|" + b"p" * 300):
        assert mac.digest(message) == hmac.digest(key, message, hashlib.sha256)


def test_non_dict_payload_is_rejected():
    payload = base64.urlsafe_b64encode(b"[1, 2]").rstrip(b"=")
    sig = sessions._sign(SECRET, NAME.encode(), payload)
    assert decode_session_cookie((payload + b"." + sig).decode(), NAME, SECRET) is None


def test_secret_is_random_per_process_and_handed_down_via_env(monkeypatch):
    original = get_session_secret()
    try:
        set_session_secret(None)
        monkeypatch.delenv(SESSION_SECRET_ENV_VAR_NAME, raising=False)
        first = get_session_secret()
        assert len(first) == 32 and get_session_secret() is first
        set_session_secret(None)
        assert get_session_secret() != first  # a new launch gets a new secret

        export_session_secret_to_env()
        handed = os.environ[SESSION_SECRET_ENV_VAR_NAME]
        parent_secret = get_session_secret()
        set_session_secret(None)  # as in a fresh worker process
        assert get_session_secret() == parent_secret == bytes.fromhex(handed)
        assert SESSION_SECRET_ENV_VAR_NAME not in os.environ  # the worker removed it
    finally:
        set_session_secret(original)


# ------------------------------------------------------------------------------------------------------------
# Middleware over real HTTP


def session_app(cookie_name: str = NAME, secret: bytes = SECRET, **middleware_options) -> FastAPI:
    app = FastAPI()
    app.add_middleware(SessionCookieMiddleware, cookie_name=cookie_name, secret=secret, **middleware_options)

    @app.post("/seed_session")
    async def seed(request: Request):
        return dict(request.session)

    @app.get("/session")
    async def read(request: Request):
        return dict(request.session)

    @app.post("/remember/{value}")
    async def remember(request: Request, value: str):
        request.session["remembered"] = value
        request.session["calls"] = request.session.get("calls", 0) + 1
        return dict(request.session)

    @app.post("/clear")
    async def clear(request: Request):
        request.session.clear()
        return {}

    @app.get("/fail")
    async def fail():
        raise ValueError("x")

    return app


@pytest.fixture(scope="module")
def url():
    with live_server(session_app()) as base_url:
        yield base_url


def test_cookie_is_set_with_the_right_name_and_attributes(url):
    response = httpx.get(f"{url}/session")
    assert response.status_code == 200
    set_cookies = response.headers.get_list("set-cookie")
    assert len(set_cookies) == 1
    header = set_cookies[0]
    assert header.startswith(f"{NAME}=")
    attrs = [a.strip().lower() for a in header.split(";")[1:]]
    assert "path=/" in attrs and "httponly" in attrs and "samesite=lax" in attrs
    session_id = response.json()[SESSION_ID_KEY]
    assert len(session_id) == 32 and int(session_id, 16) >= 0  # uuid4 hex
    assert decode_session_cookie(response.cookies[NAME], NAME, SECRET) == {SESSION_ID_KEY: session_id}


def test_session_is_kept_across_calls_and_cookie_always_resent(url):
    first = httpx.get(f"{url}/session")
    cookies = {NAME: first.cookies[NAME]}
    for _ in range(3):
        again = httpx.get(f"{url}/session", cookies=cookies)
        assert again.json()[SESSION_ID_KEY] == first.json()[SESSION_ID_KEY]
        assert NAME in again.cookies  # re-sent even though nothing changed
        assert again.cookies[NAME] == first.cookies[NAME]  # unchanged session: same value
        cookies = {NAME: again.cookies[NAME]}


def test_clients_are_isolated(url):
    with httpx.Client(base_url=url) as a, httpx.Client(base_url=url) as b:  # each keeps its own cookie jar
        a_ids = {a.get("/session").json()[SESSION_ID_KEY] for _ in range(3)}
        b_ids = {b.get("/session").json()[SESSION_ID_KEY] for _ in range(3)}
        a.post("/remember/alpha")
        assert "remembered" not in b.get("/session").json()
    assert len(a_ids) == 1 and len(b_ids) == 1 and a_ids != b_ids


def test_forged_or_foreign_cookie_gives_a_new_session(url):
    victim = httpx.get(f"{url}/session")
    victim_id = victim.json()[SESSION_ID_KEY]
    forged = _tamper_payload(victim.cookies[NAME], {SESSION_ID_KEY: "chosen-by-attacker"})
    foreign = encode_session_cookie({SESSION_ID_KEY: "from-another-launch"}, NAME, b"z" * 32)
    for bad in (forged, foreign, "not-a-cookie", '"quoted.value"'):
        response = httpx.get(f"{url}/session", cookies={NAME: bad})
        assert response.status_code == 200
        session_id = response.json()[SESSION_ID_KEY]
        assert session_id not in (victim_id, "chosen-by-attacker", "from-another-launch")
        assert decode_session_cookie(response.cookies[NAME], NAME, SECRET) == {SESSION_ID_KEY: session_id}


def test_a_stateful_server_refuses_a_cookie_it_did_not_issue_outside_the_seed_path():
    """After a restart the old process's cookie no longer verifies; a stateful server must not hand the
    rollout a fresh, empty session half-way (409), but seeding again and cookie-less calls still work."""
    with live_server(session_app(refuse_unknown_cookies=True)) as url:
        good = httpx.post(f"{url}/seed_session")
        old_launch = encode_session_cookie({SESSION_ID_KEY: "seeded-before-restart"}, NAME, b"z" * 32)
        for bad in (old_launch, "not-a-cookie"):
            refused = httpx.get(f"{url}/session", cookies={NAME: bad})
            assert refused.status_code == 409
            assert "/seed_session" in refused.json()["detail"] and NAME in refused.json()["detail"]
            reseeded = httpx.post(f"{url}/seed_session", cookies={NAME: bad})
            assert reseeded.status_code == 200 and reseeded.json()[SESSION_ID_KEY] != "seeded-before-restart"
        assert httpx.get(f"{url}/session", cookies={NAME: good.cookies[NAME]}).status_code == 200
        assert httpx.get(f"{url}/session").status_code == 200  # no cookie at all: a fresh session, as before
        other_server = encode_session_cookie({SESSION_ID_KEY: "x"}, "Other___server", b"z" * 32)
        assert httpx.get(f"{url}/session", cookies={"Other___server": other_server}).status_code == 200


def test_handler_written_values_persist(url):
    with httpx.Client(base_url=url) as client:
        client.post("/remember/first")
        second = client.post("/remember/second").json()
        assert second["remembered"] == "second" and second["calls"] == 2
        assert client.get("/session").json()["calls"] == 2


def test_cleared_session_deletes_the_cookie(url):
    with httpx.Client(base_url=url) as client:
        client.post("/remember/x")
        response = client.post("/clear")
        header = response.headers["set-cookie"]
        assert header.startswith(f"{NAME}=") and "Max-Age=0" in header
        assert "remembered" not in client.get("/session").json()


def test_cookies_of_two_servers_coexist():
    other_name = "OtherServer___other"
    with live_server(session_app()) as url_a, live_server(session_app(other_name, b"o" * 32)) as url_b:
        a = httpx.get(f"{url_a}/session")
        b = httpx.get(f"{url_b}/session")
        cookies = {**dict(a.cookies), **dict(b.cookies)}  # one dict carries both sessions (how agents thread them)
        assert set(cookies) == {NAME, other_name}
        a2 = httpx.get(f"{url_a}/session", cookies=cookies)
        b2 = httpx.get(f"{url_b}/session", cookies=cookies)
    assert a2.json()[SESSION_ID_KEY] == a.json()[SESSION_ID_KEY]
    assert b2.json()[SESSION_ID_KEY] == b.json()[SESSION_ID_KEY]
    assert a2.headers.get_list("set-cookie")[0].startswith(f"{NAME}=")  # each server only sets its own
    assert len(a2.headers.get_list("set-cookie")) == 1


def test_cookie_among_many_in_one_header_is_found(url):
    first = httpx.get(f"{url}/session")
    header = f"a=1; {NAME}x=junk; {NAME}={first.cookies[NAME]}; z=2"
    again = httpx.get(f"{url}/session", headers={"cookie": header})
    assert again.json()[SESSION_ID_KEY] == first.json()[SESSION_ID_KEY]


async def test_lifespan_and_websocket_scopes():
    seen = {}

    async def app(scope, receive, send):
        seen[scope["type"]] = scope.get("session")

    middleware = SessionCookieMiddleware(app, cookie_name=NAME, secret=SECRET)
    await middleware({"type": "lifespan"}, None, None)
    await middleware({"type": "websocket", "headers": []}, None, None)
    assert seen["lifespan"] is None
    assert SESSION_ID_KEY in seen["websocket"]


async def test_unserializable_session_value_raises_before_the_response_starts():
    sent = []

    async def app(scope, receive, send):
        scope["session"]["bad"] = object()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    middleware = SessionCookieMiddleware(app, cookie_name=NAME, secret=SECRET)
    with pytest.raises(TypeError):
        await middleware({"type": "http", "headers": []}, None, send)
    assert sent == []  # the exception middleware outside can still answer 500


def test_new_session_ids_are_random_version_4_uuids_in_hex():
    import uuid

    from nemo_gym.serving.sessions import new_session_id

    ids = [new_session_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for value in ids:
        parsed = uuid.UUID(hex=value)
        assert parsed.hex == value and parsed.version == 4 and parsed.variant == uuid.RFC_4122
