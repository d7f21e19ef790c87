"""One cached view of the head server's `/server_instances` per client, shared by the failed-server checks and the
Ray replica addresses (a real HTTP server on a thread stands in for the head server)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nemo_gym.http.client import ServerClient
from nemo_gym.http.head_view import HeadServerView, head_base_url
from nemo_gym.http.stack_health import StackHealth


@pytest.fixture
def head():
    state = {"instances": [{"process_name": "env", "state": "ready", "url": "http://127.0.0.1:1", "replica": 0}],
             "requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state["requests"] += 1
            body = json.dumps(state["instances"]).encode()
            self.send_response(200 if self.path == "/server_instances" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["port"] = server.server_address[1]
    yield state
    server.shutdown()
    server.server_close()


def test_answers_are_reused_within_max_age_and_looked_up_again_after(head):
    view = HeadServerView(head_base_url("0.0.0.0", head["port"]))
    assert view.instances(max_age=60) == head["instances"]
    head["instances"] = [{"process_name": "env", "state": "failed"}]
    assert view.instances(max_age=60)[0]["state"] == "ready"  # cached
    assert view.instances(max_age=0)[0]["state"] == "failed"  # a new lookup
    assert head["requests"] == view.lookups == 2
    view.close()


def test_a_head_server_that_does_not_answer_gives_none_and_says_why():
    view = HeadServerView("http://127.0.0.1:9", timeout_s=0.5)
    assert view.instances(max_age=0) is None
    assert "ConnectError" in view.last_error


def test_the_client_s_failed_server_checks_and_replica_addresses_share_one_view(head):
    client = ServerClient(head_server_config={"host": "127.0.0.1", "port": head["port"]},
                          global_config_dict={"env": {"resources_servers": {"x": {"host": "127.0.0.1", "port": 1}}}})
    health = client.stack_health()
    assert health.view is client.head_view()
    assert health.check() == []
    head["instances"] = [{"process_name": "env", "state": "failed", "restarts": 5}]
    assert health.check() == []  # within cache_s: the same answer
    assert client._fetch_actor_bases("env", 1) == [None]  # a fresh lookup, which the health check then reuses
    assert [f.server for f in health.check()] == ["env"]
    assert head["requests"] == 2


def test_stack_health_for_a_collection_shares_the_client_s_view(head):
    client = ServerClient(head_server_config={"host": "127.0.0.1", "port": head["port"]}, global_config_dict={})
    assert StackHealth.for_collection(client, []).view is client.head_view()
