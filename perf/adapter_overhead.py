"""What the vllm_model adapter (Responses <-> Chat Completions) costs per call.

1. In-process CPU: convert one realistic request (a 3-step tool-calling conversation with reasoning, 2 tools) to
   Chat Completions and the upstream's answer (`<think>` + a tool call) back to a Response, `--iterations` times;
   prints microseconds per call for the converter alone, and with the request validation the server does at its
   edge (`NeMoGymResponseCreateParamsNonStreaming` validate + dump) on top.
2. End to end: a zero-latency fake Chat Completions server and vllm_model each run in their own process
   (uvicorn, uvloop + httptools, 127.0.0.1); `--calls` sequential calls (one in flight, keep-alive, session cookie
   kept) go straight to the fake `/v1/chat/completions` and through vllm_model's `/v1/responses`, interleaved so
   both see the same machine load; prints the median and mean latency of both, the difference (what vllm_model
   adds per call: one more HTTP hop plus the adapter), and the CPU time per call of the vllm_model process.

Run: python perf/adapter_overhead.py [--iterations 10000] [--calls 2000] [--training]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Current weather of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "function", "name": "get_time", "description": "Local time of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
]


def request_params(training: bool) -> dict:
    """Step 3 of a rollout: system + user, then two earlier steps (reasoning + call + tool output)."""
    tokens = (lambda n: {"prompt_token_ids": list(range(40 * n)), "generation_token_ids": list(range(30)),
                         "generation_log_probs": [-0.1] * 30}) if training else (lambda n: {})
    items: list[dict] = [
        {"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
        {"role": "user", "content": "What is the weather and the local time in Paris? Answer in one sentence."},
    ]
    for step, (name, output) in enumerate([("get_weather", '{"temp_c": 21, "sky": "clear"}'),
                                           ("get_time", '{"time": "14:05"}')], start=1):
        items += [
            {"type": "reasoning", "id": f"rs_{step}",
             "summary": [{"type": "summary_text", "text": f"I should call {name} for Paris first."}]},
            {"type": "function_call", "id": f"call_{step}", "call_id": f"call_{step}", "name": name,
             "arguments": '{"city": "Paris"}', "status": "completed", **tokens(step)},
            {"type": "function_call_output", "call_id": f"call_{step}", "output": output},
        ]
    return {"input": items, "tools": TOOLS, "temperature": 0.7, "max_output_tokens": 512}


def chat_completion(training: bool) -> dict:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "<think>Both tools answered; time to write the sentence.</think>In Paris it is 21 C and clear, "
                   "and the local time is 14:05.",
    }
    if training:
        message.update(prompt_token_ids=list(range(200)), generation_token_ids=list(range(40)),
                       generation_log_probs=[-0.05] * 40)
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message, "logprobs": None}],
        "usage": {"prompt_tokens": 200, "completion_tokens": 40, "total_tokens": 240},
    }


# ------------------------------------------------------------------------------------------------- part 1


def bench_in_process(iterations: int, training: bool) -> None:
    from nemo_gym.api.chat_conversion import chat_completion_to_response, responses_to_chat_params
    from nemo_gym.api.schemas import NeMoGymResponseCreateParamsNonStreaming

    params = request_params(training)
    completion = chat_completion(training)

    def convert(p: dict) -> None:
        responses_to_chat_params(p, training=training, uses_reasoning_parser=True)
        chat_completion_to_response(p, completion, model="m")

    def with_edge() -> None:
        body = NeMoGymResponseCreateParamsNonStreaming.model_validate(params)
        convert(body.model_dump(exclude_unset=True))

    for name, fn in (("converter only (request + response)", lambda: convert(params)),
                     ("with request validation at the edge", with_edge)):
        for _ in range(min(500, iterations)):
            fn()
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        per_call = (time.perf_counter() - start) / iterations * 1e6
        print(f"  {name:<40} {per_call:8.1f} us/call  ({iterations} iterations)")


# ------------------------------------------------------------------------------------------------- part 2


def _fake_chat_app(training_tokens: bool):
    import orjson
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    body = orjson.dumps(chat_completion(False))
    logprobs = {"content": [{"token": f"token_id:{i}", "logprob": -0.05} for i in range(40)]}
    trained = chat_completion(False)
    trained["choices"][0]["logprobs"] = logprobs
    trained_body = orjson.dumps(trained)
    tokens = orjson.dumps({"tokens": list(range(200)), "count": 200, "max_model_len": 4096})

    async def chat(request: Request) -> Response:
        data = orjson.loads(await request.body())
        return Response(trained_body if data.get("logprobs") else body, media_type="application/json")

    async def tokenize(request: Request) -> Response:
        await request.body()
        return Response(tokens, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/tokenize", tokenize, methods=["POST"])])


def _serve(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools", lifespan="off")


def serve_fake(port: int) -> None:
    _serve(_fake_chat_app(False), port)


def serve_model(port: int, upstream: str, training: bool) -> None:
    from nemo_gym.servers.base import ServerClient
    from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

    config = VLLMModelConfig(host="127.0.0.1", port=port, entrypoint="app.py", name="policy_model",
                             base_url=upstream, api_key="dummy", model="m", return_token_id_information=training,
                             uses_reasoning_parser=True)
    model = VLLMModel(config=config, server_client=ServerClient(head_server_config={"host": "127.0.0.1", "port": 1},
                                                                global_config_dict={}))
    _serve(model.build_app(), port)


def _wait(url: str, proc: subprocess.Popen, method: str = "POST", json: Any = None) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server for {url} exited with {proc.returncode}")
        try:
            httpx.request(method, url, json=json, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def _timed_post(client: Any, url: str, body: dict) -> float:
    start = time.perf_counter()
    r = client.post(url, json=body)
    elapsed = time.perf_counter() - start
    r.raise_for_status()
    return elapsed


def bench_end_to_end(calls: int, training: bool) -> None:
    import httpx

    from nemo_gym.api.chat_conversion import responses_to_chat_params
    from nemo_gym.testing.stack import cpu_seconds, free_port, terminate_all

    fake_port, model_port = free_port(), free_port()
    me = [sys.executable, os.path.abspath(__file__)]
    procs = [subprocess.Popen([*me, "--serve-fake", str(fake_port)])]
    try:
        procs.append(subprocess.Popen([*me, "--serve-model", str(model_port), f"http://127.0.0.1:{fake_port}/v1"]
                                      + (["--training"] if training else [])))
        params = request_params(training)
        chat_body, _ = responses_to_chat_params(params, training=training, uses_reasoning_parser=True)
        chat_body["model"] = "m"
        direct_url = f"http://127.0.0.1:{fake_port}/v1/chat/completions"
        model_url = f"http://127.0.0.1:{model_port}/v1/responses"
        _wait(direct_url, procs[0], json=chat_body)
        _wait(model_url, procs[1], json=params)
        import psutil

        fake_proc, model_proc = psutil.Process(procs[0].pid), psutil.Process(procs[1].pid)

        with httpx.Client(timeout=30) as client:
            for _ in range(min(200, calls)):
                _timed_post(client, direct_url, chat_body)
                _timed_post(client, model_url, params)
            fake_before, model_before = cpu_seconds(fake_proc), cpu_seconds(model_proc)
            direct: list[float] = []
            through: list[float] = []
            # Interleaved, so both series see the same machine load (this box is shared and noisy).
            for _ in range(calls):
                direct.append(_timed_post(client, direct_url, chat_body))
                through.append(_timed_post(client, model_url, params))
            fake_cpu, model_cpu = cpu_seconds(fake_proc) - fake_before, cpu_seconds(model_proc) - model_before
        for name, values in (("direct to the fake chat server", direct), ("through vllm_model /v1/responses", through)):
            print(f"  {name:<40} median {statistics.median(values) * 1e3:7.3f} ms   "
                  f"mean {statistics.fmean(values) * 1e3:7.3f} ms   ({calls} sequential calls)")
        print(f"  {'added by vllm_model (hop + adapter)':<40} median "
              f"{(statistics.median(through) - statistics.median(direct)) * 1e3:7.3f} ms   mean "
              f"{(statistics.fmean(through) - statistics.fmean(direct)) * 1e3:7.3f} ms")
        n = len(through)
        print(f"  CPU per call, vllm_model process: {model_cpu / n * 1e6:6.0f} us   (fake upstream process, which also "
              f"served the direct calls: {fake_cpu / (2 * n) * 1e6:.0f} us per call)")
    finally:
        terminate_all(procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--training", action="store_true", help="token-id mode (logprobs + /tokenize)")
    parser.add_argument("--serve-fake", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-model", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake)
        return
    if args.serve_model:
        serve_model(int(args.serve_model[0]), args.serve_model[1], args.training)
        return
    mode = "training mode" if args.training else "inference mode"
    print(f"vllm_model adapter overhead ({mode}, reasoning parser on)")
    print("in-process CPU per call:")
    bench_in_process(args.iterations, args.training)
    print("end-to-end latency, 1 call in flight, 0 ms model:")
    bench_end_to_end(args.calls, args.training)


if __name__ == "__main__":
    main()
