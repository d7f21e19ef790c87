"""What vllm_model's training mode costs per call for each token source an upstream may send, at 1k / 16k / 64k
generated tokens (2,000 prompt ids).

The sources (`nemo_gym/api/token_sources.py`), each as an upstream sends it:

- `message`: NeMo RL's vLLM server: the bundle on `choices[0].message` (`prompt_token_ids`, `generation_token_ids`,
  `generation_log_probs`), no per-token logprobs list;
- `engine`: vLLM >= 0.10.2 asked with `return_token_ids`: top-level `prompt_token_ids`, `choices[0].token_ids` and
  `choices[0].logprobs.content` (`token_id:N` tokens);
- `logprobs`: an older vLLM: `choices[0].logprobs.content` only, the prompt's ids from `POST /tokenize`.

An upstream process answers every chat completion with a pre-built body of the shape and size named in the
request's `metadata` (so it spends no time building them); vllm_model runs in its own process (uvicorn, uvloop +
httptools) in training mode; `--calls` sequential `POST /v1/responses` per row, after a warm-up. Printed per row:
the answer's size, the median latency and the CPU time per call of the vllm_model process (what the model server
spends on the call: parsing the upstream's answer, reading its token data, building and sending the Response).
A row whose calls fail prints the status and the start of the error instead.

`--in-process`: also time the reading of the token data alone (`TokenSources.take` + `resolve`, median thread CPU
of `--repeat` runs), without HTTP.

Run: python perf/token_sources.py [--calls 20] [--sizes 1000,16000,64000] [--in-process]
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

PROMPT_IDS = 2_000
SHAPES = ("message", "engine", "logprobs")


def upstream_completion(shape: str, generated: int) -> dict:
    """The chat completion an upstream of `shape` answers with `generated` tokens."""
    ids = [1_000 + (k * 7919) % 150_000 for k in range(generated)]
    log_probs = [-((k % 97) + 1) / 97.0 for k in range(generated)]
    prompt = list(range(100, 100 + PROMPT_IDS))
    message: dict[str, Any] = {"role": "assistant", "content": "word " * min(generated, 4_000)}
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    completion: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "m", "choices": [choice],
        "usage": {"prompt_tokens": PROMPT_IDS, "completion_tokens": generated,
                  "total_tokens": PROMPT_IDS + generated},
    }
    if shape == "message":
        message.update(prompt_token_ids=prompt, generation_token_ids=ids, generation_log_probs=log_probs)
        return completion
    choice["logprobs"] = {"content": [
        {"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []} for i, lp in zip(ids, log_probs)
    ]}
    if shape == "engine":
        completion["prompt_token_ids"] = prompt
        choice["token_ids"] = ids
    return completion


def serve_upstream(port: int, sizes: list[int]) -> None:
    import orjson
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    bodies = {(shape, n): orjson.dumps(upstream_completion(shape, n)) for shape in SHAPES for n in sizes}
    tokens = orjson.dumps({"tokens": list(range(100, 100 + PROMPT_IDS)), "count": PROMPT_IDS, "max_model_len": 1 << 20})

    async def chat(request: Request) -> Response:
        metadata = orjson.loads(await request.body()).get("metadata") or {}
        return Response(bodies[(metadata["shape"], int(metadata["generated"]))], media_type="application/json")

    async def tokenize(request: Request) -> Response:
        await request.body()
        return Response(tokens, media_type="application/json")

    _serve(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/tokenize", tokenize, methods=["POST"])]), port)


def serve_model(port: int, upstream: str) -> None:
    from nemo_gym.servers.base import ServerClient
    from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

    config = VLLMModelConfig(host="127.0.0.1", port=port, entrypoint="app.py", name="policy_model",
                             base_url=upstream, api_key="dummy", model="m", return_token_id_information=True,
                             uses_reasoning_parser=False)
    model = VLLMModel(config=config, server_client=ServerClient(head_server_config={"host": "127.0.0.1", "port": 1},
                                                                global_config_dict={}))
    _serve(model.build_app(), port)


def _serve(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools", lifespan="off")


def _wait_up(url: str, proc: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server for {url} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def bench_end_to_end(calls: int, sizes: list[int]) -> None:
    import httpx
    import psutil

    from nemo_gym.testing.stack import cpu_seconds, free_port, terminate_all

    upstream_port, model_port = free_port(), free_port()
    me = [sys.executable, os.path.abspath(__file__)]
    procs = [subprocess.Popen([*me, "--serve-upstream", str(upstream_port), ",".join(map(str, sizes))])]
    try:
        procs.append(subprocess.Popen([*me, "--serve-model", str(model_port), f"http://127.0.0.1:{upstream_port}/v1"]))
        _wait_up(f"http://127.0.0.1:{upstream_port}/tokenize", procs[0])
        _wait_up(f"http://127.0.0.1:{model_port}/health", procs[1])
        model = psutil.Process(procs[1].pid)
        url = f"http://127.0.0.1:{model_port}/v1/responses"
        print(f"{'source':<10} {'generated':>9} {'answer':>9} {'median':>10} {'CPU/call':>10}")
        with httpx.Client(timeout=120) as client:
            for n in sizes:
                for shape in SHAPES:
                    body = {"input": "hello", "metadata": {"shape": shape, "generated": str(n)}}
                    count = calls * max(1, 16_000 // n)
                    first = client.post(url, json=body)
                    if first.status_code != 200:
                        print(f"{shape:<10} {n:>9} {'':>9} fails: HTTP {first.status_code} {first.text[:160]!r}")
                        continue
                    for _ in range(2):
                        client.post(url, json=body)
                    before = cpu_seconds(model)
                    latencies = []
                    for _ in range(count):
                        start = time.perf_counter()
                        response = client.post(url, json=body)
                        latencies.append(time.perf_counter() - start)
                        response.raise_for_status()
                    cpu = (cpu_seconds(model) - before) / count
                    size = len(orjson_dumps(upstream_completion(shape, n)))
                    print(f"{shape:<10} {n:>9} {size / 1e6:>7.2f}MB {statistics.median(latencies) * 1e3:>8.1f}ms "
                          f"{cpu * 1e3:>8.1f}ms   ({count} calls)")
    finally:
        terminate_all(procs)


def orjson_dumps(value: Any) -> bytes:
    import orjson

    return orjson.dumps(value)


def bench_in_process(sizes: list[int], repeat: int) -> None:
    import orjson

    from nemo_gym.api.token_sources import TokenSources

    print(f"{'source':<10} {'generated':>9} {'read tokens (take + resolve), median thread CPU':>50}")
    for n in sizes:
        for shape in SHAPES:
            raw = orjson.dumps(upstream_completion(shape, n))
            times = []
            for _ in range(repeat):
                completion = orjson.loads(raw)
                start = time.thread_time()
                sources = TokenSources("perf")
                sources.take(completion)
                kept = sources.resolve()
                times.append(time.thread_time() - start)
                del kept, sources, completion  # freeing the lists is the caller's cost, later, not the reading's
            print(f"{shape:<10} {n:>9} {statistics.median(times) * 1e3:>48.2f}ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20, help="calls per row at 16k and more (16k/n times as many below)")
    parser.add_argument("--sizes", default="1000,16000,64000")
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--serve-upstream", nargs=2, metavar=("PORT", "SIZES"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-model", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(int(args.serve_upstream[0]), [int(s) for s in args.serve_upstream[1].split(",")])
        return
    if args.serve_model:
        serve_model(int(args.serve_model[0]), args.serve_model[1])
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"vllm_model training mode, POST /v1/responses, {PROMPT_IDS} prompt ids, 1 call in flight")
    bench_end_to_end(args.calls, sizes)
    if args.in_process:
        bench_in_process(sizes, args.repeat)


if __name__ == "__main__":
    main()
