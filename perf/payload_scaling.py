"""Issue 36, item 5: what training-sized rollouts cost the stack, against a floor that moves the same bytes.

The weather task (resources_servers/weather_tool_use + simple_agent) in training mode (vllm_model with
`responses_api_models/vllm_model/configs/vllm_model_for_training.yaml`: `return_token_id_information: true`) in
front of the fake vLLM backend (`nemo_gym.testing.fake_openai_server`), which answers every model call with N
generated tokens and 2,000 prompt ids (`--prompt-token-count`, `--varied-token-values`: ids and log probs as long
in JSON as a real engine's). The token data comes as NeMo RL's bundle on `choices[0].message` (`--source bundle`,
the default; 1.7 MB per call at 64k) or as vLLM's engine ids + its per-token logprobs list (`--source engine`,
4.0 MB). A rollout is `--calls` model calls (default 2: a `get_weather` call, then the answer); each call's text
has N words, so N generated tokens, and the final one states the tool's report (reward 1).

Against the payload floor (`perf/floor_payload.py`, served by `floor_stack.py --payload`): the same hops
(collector -> agent -> model server -> backend and back, agent -> resources server `/get_weather` and `/verify`
with the whole rollout, back to the collector) on bare asyncio + orjson, parsing each body once and serializing
each answer once. Both are driven in turn by the same load generator (`rollout_throughput.drive`) with the same
row, `--repeats` times per case, alternating, and the table shows medians:

- CPU ms per rollout: user + system CPU of the 3 server processes (not the backend, not the load generator), per
  process for the stack, and the ratio stack / floor;
- RSS (sum of the 3 server processes, MB): idle (after start-up and a small warm-up, before any large burst), the
  peak while a case runs (sampled every 50 ms), and after the case (`--settle` seconds later);
- the `/run` answer's size (the whole rollout, what the collector receives), floor / stack, so one can check both
  move the same token bytes; and the floor's exchanges per rollout (checked: 2 + 3 x calls).

Cases: every size of `--sizes` at every level of `--in-flight`, then `--multi-turn-calls` model calls per rollout at
`--multi-turn-size` (issue 36: 4+ calls at 16k). `--profile DIR` then records the stack's 3 server processes with
py-spy while the largest size runs at the highest level, and prints per process where the time goes by function
family (JSON parse, pydantic validation, model construction, model_dump, serialization, copies, token reading, HTTP
and event loop, other) in ms per rollout, and the functions with the most samples. py-spy samples wall time of
non-idle threads, so a process preempted on the shared cores is over-counted; the shares are the useful part.

    python perf/payload_scaling.py                                   # 1k / 16k / 64k, P=1 and 16, 4 calls at 16k
    python perf/payload_scaling.py --repeats 3 --profile /tmp/payload_profile
    python perf/payload_scaling.py --sizes 200 --in-flight 1,2 --rollouts 4 --repeats 1 --multi-turn-size 200  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import linecache
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor_stack import floor_exchanges, start_floor, stop_floor  # noqa: E402
from floor_vs_stack import times  # noqa: E402
from rollout_throughput import REPO, drive  # noqa: E402

from nemo_gym.testing.stack import (  # noqa: E402
    FakeLLMBackend,
    NgRunStack,
    cpu_seconds,
    fake_llm_overrides,
    free_port,
    server_instances,
)

CONFIGS = [
    "resources_servers/weather_tool_use/configs/weather_tool_use.yaml",
    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
]
PROMPT_IDS = 2_000
MB = 1024 * 1024
FINAL = "In Oslo it is -4 degrees with freezing fog."


def role(process_name: str) -> str:
    return "agent" if process_name.endswith("_agent") else "model" if process_name == "policy_model" else "resources"


def words(prefix: str, n: int) -> str:
    """`prefix` padded with " tok" to n words (n generated tokens: the fake backend makes one per word)."""
    return prefix + " tok" * max(0, n - len(prefix.split()))


def tag(size: int, calls: int) -> str:
    return f"[payload n={size} calls={calls}]"


def script_rules(cases: list[tuple[int, int]]) -> list[dict]:
    """Per case, one rule per model call (matched on the row's tag and the tool results so far): `calls - 1`
    `get_weather` calls, then the answer stating the report; each call's text is `size` words."""
    rules = []
    for size, calls in cases:
        for k in range(calls):
            match = {"last_user_contains": tag(size, calls), "tool_outputs": k}
            if k < calls - 1:
                output = [words("Let me look that up.", size),
                          {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Oslo"}'}]
            else:
                output = [words(FINAL, size)]
            rules.append({"name": f"n{size}c{calls}k{k}", "match": match, "output": output})
    return rules


def case_row(size: int, calls: int) -> dict:
    path = REPO / "resources_servers/weather_tool_use/data/example.jsonl"
    row = json.loads(path.read_text().splitlines()[0])
    row["responses_create_params"]["input"][-1]["content"] = f"Tell me the current weather in Oslo. {tag(size, calls)}"
    row["expected_city"] = "Oslo"
    return row


def rss_mb(procs: dict) -> float:
    total = 0
    for p in procs.values():
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / MB


class PeakRSS:
    """The peak of the summed RSS of `procs`, sampled every `period` seconds in a thread while in the block."""

    def __init__(self, procs: dict, period: float = 0.05):
        self.procs, self.period, self.peak = procs, period, 0.0
        self._stop = threading.Event()

    def __enter__(self) -> "PeakRSS":
        self.peak = rss_mb(self.procs)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, rss_mb(self.procs))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.peak = max(self.peak, rss_mb(self.procs))


def measure(procs: dict, url: str, row: dict, total: int, level: int, settle: float, floor: dict | None) -> dict:
    exchanges0 = floor_exchanges(floor) if floor else 0
    before = {name: cpu_seconds(p) for name, p in procs.items()}
    with PeakRSS(procs) as peak:
        wall, _, failures = asyncio.run(drive(url, row, total, level))
    cpu = {name: (cpu_seconds(p) - before[name]) * 1000 / total for name, p in procs.items()}
    time.sleep(settle)
    result = {"cpu": sum(cpu.values()), "per_process": cpu, "failures": failures, "rps": total / wall,
              "peak": peak.peak, "after": rss_mb(procs),
              "after_each": {name: rss_mb({name: p}) for name, p in procs.items()}}
    if floor:
        result["exchanges"] = (floor_exchanges(floor) - exchanges0) / total
    return result


def median_of(runs: list[dict]) -> dict:
    mid = statistics.median
    out = {k: mid(r[k] for r in runs) for k in ("cpu", "rps", "peak", "after")}
    out["per_process"] = {k: mid(r["per_process"][k] for r in runs) for k in runs[0]["per_process"]}
    out["after_each"] = {k: mid(r["after_each"][k] for r in runs) for k in runs[0]["after_each"]}
    out["failures"] = sum(r["failures"] for r in runs)
    out["spread"] = (min(r["cpu"] for r in runs), max(r["cpu"] for r in runs))
    out["exchanges"] = sorted({r["exchanges"] for r in runs if "exchanges" in r})
    return out


def answer_bytes(url: str, row: dict) -> int:
    """One `/run` (also a warm-up of the case): the size of the whole rollout the collector receives."""
    reply = httpx.post(url, json=row, timeout=600)
    reply.raise_for_status()
    if reply.json().get("reward") != 1.0:
        raise SystemExit(f"{url}: the rollout was not rewarded: {reply.text[:300]}")
    return len(reply.content)


# ------------------------------------------------------------------------------------------------- profile

FAMILIES = [  # (family, regex on a frame "function (file:line)" or on the leaf's source line); first match wins
    ("JSON parse", r"\bloads\(|parse_inner_json|get_response_json|\.json\(\)|json/decoder"),
    ("model_dump", r"model_dump|dump_python"),
    ("serialization", r"\bdumps\(|dump_json|to_json|encode_json_body|_serializer|serialize|jsonable_encoder"),
    ("pydantic validation", r"model_validate|validate_python|validate_json|TypeAdapter|pydantic/|fastapi/dependencies"),
    ("copies", r"deepcopy|\bcopy\(|bytes\(|bytearray|\.join\(|b\"\"\.join|\[:\]"),
    ("token reading", r"token_sources|chat_conversion|token_ids|log_probs|logprobs"),
    ("model construction", r"^\s*(return\s+)?[A-Z]\w+\(|\*\*\w+\.model_dump"),
    ("HTTP and event loop", r"nemo_gym/http/|nemo_gym/serving/|uvloop|asyncio/|httptools|h11|aiohttp/|starlette/"),
]


LEAF_FUNCTIONS = [  # pydantic's own entry points, named by the leaf frame itself (their source lines say nothing)
    ("pydantic validation", r"model_validate|validate_python|validate_json|BaseModel\.__init__"),
    ("model_dump", r"model_dump|dump_python"),
    ("serialization", r"dump_json|to_json"),
    ("event loop (C: socket I/O, buffer copies, freeing)", r"^Runner\.run "),
]


def family_of(frames: list[str]) -> str:
    leaf = frames[-1]
    for family, pattern in LEAF_FUNCTIONS:
        if re.search(pattern, leaf.split(" (")[0] + " "):
            return family
    found = re.match(r"(.*) \((.*):(\d+)\)$", leaf)
    if found:  # a builtin (orjson, pydantic-core) shows as the Python line that called it
        line = linecache.getline(found.group(2), int(found.group(3)))
        for family, pattern in FAMILIES:
            if re.search(pattern, line):
                return family
    for frame in reversed(frames):
        for family, pattern in FAMILIES:
            if family != "model construction" and re.search(pattern, frame):
                return family
    return "other"


def summarise_profile(path: Path, rate: int, rollouts: int, top: int) -> tuple[dict, list[str]]:
    families: collections.Counter = collections.Counter()
    leaves: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines() if path.exists() else ():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = [f for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        families[family_of(frames)] += int(count)
        leaves[frames[-1]] += int(count)
    per = 1000.0 / rate / rollouts  # ms of sampled time per rollout per sample
    lines = [f"    {n * per:7.2f} ms  {frame}" for frame, n in leaves.most_common(top)]
    return {k: v * per for k, v in families.items()}, lines


def profile(servers: dict, url: str, row: dict, rollouts: int, level: int, out_dir: Path, rate: int, top: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    spies = {}
    for name, instance in servers.items():
        spies[name] = subprocess.Popen(
            ["py-spy", "record", "--pid", str(instance["pid"]), "--rate", str(rate), "--nonblocking",
             "--format", "raw", "--output", str(out_dir / f"{name}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # let py-spy attach
        procs = {name: psutil.Process(s["pid"]) for name, s in servers.items()}
        before = {name: cpu_seconds(p) for name, p in procs.items()}
        wall, _, failures = asyncio.run(drive(url, row, rollouts, level))
        cpu = {name: (cpu_seconds(p) - before[name]) * 1000 / rollouts for name, p in procs.items()}
    finally:
        for spy in spies.values():
            spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for spy in spies.values():
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()
    print(f"\nprofile: {rollouts} rollouts at {level} in flight ({failures} failures), py-spy {rate} Hz, raw stacks "
          f"in {out_dir}; ms per rollout of sampled (non-idle) time by function family, and the process's CPU")
    names = [f for f, _ in FAMILIES] + [LEAF_FUNCTIONS[-1][0], "other"]
    results = {name: summarise_profile(out_dir / f"{name}.txt", rate, rollouts, top) for name in servers}
    print(f"{'family':<50}" + "".join(f" {name:>10}" for name in servers))
    for family in names:
        print(f"{family:<50}" + "".join(f" {results[n][0].get(family, 0.0):>10.2f}" for n in servers))
    print(f"{'sampled total':<50}" + "".join(f" {sum(results[n][0].values()):>10.2f}" for n in servers))
    print(f"{'CPU (psutil)':<50}" + "".join(f" {cpu[n]:>10.2f}" for n in servers))
    for name in servers:
        print(f"\n  {name}: leaf frames with the most samples (ms per rollout)")
        print("\n".join(results[name][1]))


# ------------------------------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,16000,64000", help="generated tokens per model call")
    parser.add_argument("--in-flight", default="1,16")
    parser.add_argument("--rollouts", default="200,64,32",
                        help="rollouts per case, one per size (the last repeats); at least 2x the level")
    parser.add_argument("--calls", type=int, default=2, help="model calls per rollout in the size cases")
    parser.add_argument("--multi-turn-size", type=int, default=16000)
    parser.add_argument("--multi-turn-calls", type=int, default=4, help="0: no multi-turn case")
    parser.add_argument("--source", choices=["bundle", "engine"], default="bundle",
                        help="bundle: NeMo RL's on the message; engine: vLLM's token_ids + per-token logprobs")
    parser.add_argument("--repeats", type=int, default=2, help="runs per case, floor and stack alternating")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after a case before the after-RSS")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the stack at the largest size into DIR")
    parser.add_argument("--profile-rollouts", type=int, default=48)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    levels = [int(x) for x in args.in_flight.split(",") if x]
    counts = [int(x) for x in args.rollouts.split(",") if x]
    counts += [counts[-1]] * (len(sizes) - len(counts))
    cases = [(size, args.calls, count) for size, count in zip(sizes, counts)]
    if args.multi_turn_calls:
        mt = args.multi_turn_size
        cases.append((mt, args.multi_turn_calls, counts[sizes.index(mt)] if mt in sizes else counts[-1]))
    if args.profile and shutil.which("py-spy") is None:
        sys.exit("--profile needs py-spy (pip install py-spy)")

    script = Path(tempfile.mkdtemp(prefix="ng_payload_")) / "rules.json"
    script.write_text(json.dumps(script_rules(sorted({(s, c) for s, c, _ in cases}))))
    source = ["--message-token-bundle"] if args.source == "bundle" else ["--chat-prompt-token-ids"]
    load = lambda: " ".join(f"{x:.2f}" for x in psutil.getloadavg())  # noqa: E731
    print(f"load average at start: {load()}", file=sys.stderr, flush=True)

    with FakeLLMBackend("--script", str(script), *source, "--prompt-token-count", str(PROMPT_IDS),
                        "--varied-token-values") as backend:
        floor = start_floor(backend.url, payload=True)
        head_port = free_port()
        stack = NgRunStack(fake_llm_overrides(CONFIGS, backend.base_url, head_port), cwd=REPO)
        try:
            stack.wait_for("servers ready!", timeout=180)
            servers = {role(i["process_name"]): i for i in server_instances(head_port)}
            systems = {
                "floor": (floor["url"], {n: psutil.Process(floor[n].proc.pid) for n in ("agent", "model", "resources")}),
                "stack": (servers["agent"]["url"] + "/run", {n: psutil.Process(s["pid"]) for n, s in servers.items()}),
            }
            small = case_row(cases[0][0], cases[0][1])
            for url, _ in systems.values():  # warm-up with the smallest case
                asyncio.run(drive(url, small, 20, 4))
            time.sleep(args.settle)
            idle = {name: rss_mb(procs) for name, (_, procs) in systems.items()}
            results = []
            for size, calls, count in cases:
                row = case_row(size, calls)
                sizes_seen = {name: answer_bytes(url, row) for name, (url, _) in systems.items()}
                for level in levels:
                    total = max(count, 2 * level)
                    samples: dict = {name: [] for name in systems}
                    for _ in range(args.repeats):
                        for name, (url, procs) in systems.items():
                            samples[name].append(measure(procs, url, row, total, level, args.settle,
                                                         floor if name == "floor" else None))
                    results.append({"size": size, "calls": calls, "level": level, "total": total,
                                    "bytes": sizes_seen, **{n: median_of(s) for n, s in samples.items()}})
                    print(f"  done: {size} tokens x {calls} calls, {level} in flight (load {load()})",
                          file=sys.stderr, flush=True)
            if args.profile:
                size, calls, _ = max(cases[:len(sizes)], key=lambda c: c[0])
                profile(servers, systems["stack"][0], case_row(size, calls), args.profile_rollouts, max(levels),
                        args.profile, args.rate, args.top)
        finally:
            stack.stop(timeout=60)
            stop_floor(floor)

    print(f"\npayload scaling: weather_tool_use + vllm_model (training) + simple_agent, {PROMPT_IDS} prompt ids per "
          f"call, token data as {'NeMo RL bundle on the message' if args.source == 'bundle' else 'vLLM engine ids + logprobs'}; "
          f"CPU = ms per rollout, user+system, of the 3 server processes; RSS = MB, sum of the 3 server processes; "
          f"medians of {args.repeats} runs; load average at the end {load()}")
    print(f"idle RSS (after start-up and a small warm-up): floor {idle['floor']:.0f} MB, stack {idle['stack']:.0f} MB")
    print(f"{'tokens':>7} {'calls':>5} {'P':>3} {'n':>4} | {'floor CPU':>9} {'stack CPU':>9} {'ratio':>6} | "
          f"{'agent':>7} {'model':>7} {'resrc':>7} | {'floor RSS peak/after':>20} {'stack RSS peak/after':>20} | "
          f"{'/run answer floor/stack':>23} | {'r/s f/s':>9} {'fail':>5}")
    for r in results:
        f, s = r["floor"], r["stack"]
        p = s["per_process"]
        print(f"{r['size']:>7} {r['calls']:>5} {r['level']:>3} {r['total']:>4} | {f['cpu']:>9.2f} {s['cpu']:>9.2f} "
              f"{times(s['cpu'], f['cpu']):>6} | {p['agent']:>7.2f} {p['model']:>7.2f} {p['resources']:>7.2f} | "
              f"{f['peak']:>9.0f}/{f['after']:<10.0f} {s['peak']:>9.0f}/{s['after']:<10.0f} | "
              f"{r['bytes']['floor'] / 1e6:>9.2f}/{r['bytes']['stack'] / 1e6:<5.2f} MB | "
              f"{f['rps']:>4.0f}/{s['rps']:<4.0f} {f['failures']:>2}/{s['failures']:<2}")
    print("per process, floor -> stack (CPU ms per rollout; RSS MB after the case), and the spread of the runs' totals:")
    for r in results:
        e, s = r["floor"]["per_process"], r["stack"]["per_process"]
        print(f"{r['size']:>7} x{r['calls']} P={r['level']:<3} | "
              + "  ".join(f"{n} {e[n]:.2f} -> {s[n]:.2f} ({times(s[n], e[n])}; {r['floor']['after_each'][n]:.0f} -> "
                          f"{r['stack']['after_each'][n]:.0f} MB)" for n in ("agent", "model", "resources"))
              + f" | floor {r['floor']['spread'][0]:.2f}..{r['floor']['spread'][1]:.2f}, "
                f"stack {r['stack']['spread'][0]:.2f}..{r['stack']['spread'][1]:.2f}")
    wrong = [(r["size"], r["calls"], r["level"], r["floor"]["exchanges"]) for r in results
             if r["floor"]["exchanges"] != [2 + 3 * r["calls"]]]
    for size, calls, level, seen in wrong:
        print(f"ERROR: the floor made {seen} HTTP exchanges per rollout ({size} tokens x {calls} calls, {level} in "
              f"flight), not {2 + 3 * calls}", file=sys.stderr)
    if wrong or any(r[n]["failures"] for r in results for n in ("floor", "stack")):
        sys.exit(1)
    print("exchanges: every floor run made 2 + 3 x calls HTTP exchanges per rollout; no failures")


if __name__ == "__main__":
    main()
