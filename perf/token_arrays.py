"""Issue 36, item 2: what pydantic costs on training-sized token arrays, in-process, against orjson on the same bytes.

Two exchanges of the weather task in training mode, built in memory (2 model calls per rollout, N generated tokens
per call, token ids and log probs as long in JSON as a real engine's: `fake_openai_server`'s `varied_token_values`;
call k's prompt ids are 2,000 + k x (N + 50) ids, as token-in/token-out makes them):

- the resources server's `/verify`: the body (the row plus the whole rollout, 4.3 MB at 64k) validated with a
  verify request model as hot routes do (`model_validate_json`), the verify idiom `Response(**body.model_dump(),
  reward=...)`, and the answer serialized as hot routes do (`TypeAdapter(Response).validate_python(...,
  from_attributes=True)` then `dump_json`). Floor: `orjson.loads` of the body + `orjson.dumps` of the answer;
- the model server's `/v1/responses` for a third call: a request whose `input` carries 2 calls' token arrays,
  validated (`NeMoGymResponseCreateParamsNonStreaming.model_validate_json`) and dumped as vllm_model does
  (`model_dump(exclude_unset=True)`). Floor: `orjson.loads` of the body.

CPU time (`time.process_time`) per step, the median of `--repeats` runs with the floor measured in turn. The line
`answer sha1` fingerprints the /verify answer's bytes, so runs of two trees can be checked to answer the same. To
compare with another tree: `PYTHONPATH=<tree> python perf/token_arrays.py`.

    python perf/token_arrays.py                    # 1k, 16k, 64k
    python perf/token_arrays.py --sizes 64000 --repeats 15
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import statistics
import time
from typing import Any, Callable

import orjson
from pydantic import TypeAdapter

import nemo_gym
from nemo_gym.api.schemas import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.servers.resources_server import BaseVerifyRequest, BaseVerifyResponse

PROMPT_IDS = 2_000


class VerifyRequest(BaseVerifyRequest):
    expected_city: str


class VerifyResponse(VerifyRequest, BaseVerifyResponse):
    called_get_weather: bool = False


def tokens(n: int, start: int) -> tuple[list[int], list[float]]:
    """`fake_openai_server`'s varied made-up tokens start..start+n."""
    ids = [1000 + ((start + k) * 7919) % 150_000 for k in range(n)]
    log_probs = [-(((start + k) % 97) + 1) / 97.0 for k in range(n)]
    return ids, log_probs


def call_items(n: int, call: int, final: bool) -> list[dict]:
    """The output items of model call `call`: its message (n words), then a tool call and its output unless final;
    the token arrays on the call's last output item."""
    ids, log_probs = tokens(n, call * n)
    text = ("In Oslo it is -4 degrees with freezing fog." if final else "Let me look that up.") + " tok" * n
    message = {"id": f"msg_{call}", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}
    token_data = {"prompt_token_ids": list(range(100, 100 + PROMPT_IDS + call * (n + 50))),
                  "generation_token_ids": ids, "generation_log_probs": log_probs}
    if final:
        return [{**message, **token_data}]
    call_item = {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Oslo"}',
                 "call_id": f"call_{call}", "id": f"fc_{call}", "status": "completed", **token_data}
    tool_output = {"type": "function_call_output", "call_id": f"call_{call}",
                   "output": '{"city": "Oslo", "temperature_c": -4, "condition": "freezing fog"}'}
    return [message, call_item, tool_output]


TOOLS = [{"type": "function", "name": "get_weather", "strict": True,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
USER = {"role": "user", "content": "Tell me the current weather in Oslo."}


def verify_body(n: int) -> bytes:
    output = call_items(n, 0, final=False) + call_items(n, 1, final=True)
    response = {"id": "resp_1", "created_at": 1_700_000_000, "model": "policy", "object": "response",
                "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": TOOLS,
                "usage": {"input_tokens": PROMPT_IDS, "output_tokens": 2 * n, "total_tokens": PROMPT_IDS + 2 * n}}
    row = {"responses_create_params": {"input": [USER], "tools": TOOLS}, "expected_city": "Oslo"}
    return orjson.dumps({**row, "response": response})


def model_request(n: int, calls: int = 2) -> bytes:
    items: list[dict] = [USER]
    for call in range(calls):
        items += call_items(n, call, final=False)
    return orjson.dumps({"input": items, "tools": TOOLS, "temperature": 1.0})


def cpu_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.process_time()
    value = fn()
    return (time.process_time() - start) * 1000, value


def measure(size: int, repeats: int) -> tuple[dict[str, float], str]:
    vbody, mbody = verify_body(size), model_request(size)
    answer_type = TypeAdapter(VerifyResponse)
    runs: dict[str, list[float]] = {}
    digest = ""

    def note(step: str, ms: float) -> None:
        runs.setdefault(step, []).append(ms)

    for _ in range(repeats):
        gc.collect()
        # the stack's steps
        ms, body = cpu_ms(lambda: VerifyRequest.model_validate_json(vbody)); note("verify: validate body", ms)
        ms, dumped = cpu_ms(lambda: body.model_dump()); note("verify: model_dump", ms)
        ms, answer = cpu_ms(lambda: VerifyResponse(**dumped, reward=1.0, called_get_weather=True))
        note("verify: construct answer", ms)
        ms, raw = cpu_ms(lambda: answer_type.dump_json(
            answer_type.validate_python(answer, from_attributes=True), by_alias=True))
        note("verify: serialize answer", ms)
        digest = hashlib.sha1(raw).hexdigest()[:12]
        ms, params = cpu_ms(lambda: NeMoGymResponseCreateParamsNonStreaming.model_validate_json(mbody))
        note("model: validate request", ms)
        ms, _ = cpu_ms(lambda: params.model_dump(exclude_unset=True)); note("model: model_dump", ms)
        del body, dumped, answer, params
        # the floor's, in turn
        gc.collect()
        ms, parsed = cpu_ms(lambda: orjson.loads(vbody)); note("floor verify: orjson.loads", ms)
        parsed["reward"] = 1.0
        ms, _ = cpu_ms(lambda: orjson.dumps(parsed)); note("floor verify: orjson.dumps", ms)
        ms, _ = cpu_ms(lambda: orjson.loads(mbody)); note("floor model: orjson.loads", ms)
        del parsed
    medians = {step: statistics.median(values) for step, values in runs.items()}
    return medians, digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,16000,64000", help="generated tokens per model call")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    print(f"nemo_gym from {nemo_gym.__file__}")
    for size in (int(s) for s in args.sizes.split(",")):
        medians, digest = measure(size, args.repeats)
        verify = sum(v for k, v in medians.items() if k.startswith("verify:"))
        verify_floor = sum(v for k, v in medians.items() if k.startswith("floor verify:"))
        model = sum(v for k, v in medians.items() if k.startswith("model:"))
        model_floor = medians["floor model: orjson.loads"]
        print(f"\n{size} generated tokens per call: /verify body {len(verify_body(size)) / 1e6:.2f} MB, "
              f"model request {len(model_request(size)) / 1e6:.2f} MB; answer sha1 {digest}")
        for step, ms in medians.items():
            print(f"  {step:32s} {ms:8.2f} ms")
        print(f"  /verify total {verify:.2f} ms, floor {verify_floor:.2f} ms: {verify / verify_floor:.2f}x")
        print(f"  model server total {model:.2f} ms, floor {model_floor:.2f} ms: {model / model_floor:.2f}x")


if __name__ == "__main__":
    main()
