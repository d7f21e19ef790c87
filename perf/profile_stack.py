"""Where the stack's CPU goes: py-spy samples each server process while the weather task runs under load.

Starts the same stack as `floor_vs_stack.py` (fake LLM, example_single_tool_call + openai_model + simple_agent),
drives `--rollouts` `/run` calls at `--in-flight`, and records every server process with `py-spy record` (raw
collapsed stacks, `--nonblocking` so the sampled process is not paused). Prints, per process, the share of samples
by top-level area (our code by subpackage, FastAPI/Starlette, pydantic, uvicorn, aiohttp, httpx, the event loop,
idle) and the functions with the most self time. `--keep DIR` keeps the collapsed stacks (load them in
speedscope or flamegraph.pl).

    python perf/profile_stack.py --in-flight 16 --rollouts 3000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor_vs_stack import running_stack
from rollout_throughput import drive, load_row

from nemo_gym.testing.stack import FakeLLMBackend

# (area, substring of a frame's "function (file:line)" text); the first match from the leaf upwards wins.
AREAS = [
    ("nemo_gym.http", "nemo_gym/http/"),
    ("nemo_gym.servers", "nemo_gym/servers/"),
    ("nemo_gym.api", "nemo_gym/api/"),
    ("nemo_gym (other)", "nemo_gym/"),
    ("environment code", "responses_api_"),
    ("environment code", "resources_servers/"),
    ("pydantic", "pydantic"),
    ("fastapi", "fastapi/"),
    ("starlette", "starlette/"),
    ("uvicorn", "uvicorn/"),
    ("aiohttp", "aiohttp/"),
    ("httpx", "httpx/"),
    ("httpcore", "httpcore/"),
    ("orjson/json", "json/"),
    ("asyncio/uvloop", "asyncio/"),
    ("asyncio/uvloop", "uvloop/"),
    ("logging", "logging/"),
]


def area_of(frames: list[str]) -> str:
    for frame in reversed(frames):  # leaf last in py-spy's raw format
        for area, needle in AREAS:
            if needle in frame:
                return area
    return "other"


def summarise(path: Path, top: int) -> str:
    areas: collections.Counter = collections.Counter()
    self_time: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        areas[area_of(frames)] += n
        self_time[frames[-1]] += n
    if not total:
        return "  (no samples)"
    out = ["  by area: " + ", ".join(f"{a} {100 * n / total:.0f}%" for a, n in areas.most_common())]
    out += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in self_time.most_common(top)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=3000)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25, help="functions listed per process")
    parser.add_argument("--keep", type=Path, default=None, help="directory to keep the collapsed stacks in")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("py-spy is not installed: pip install py-spy")

    out_dir = args.keep or Path(tempfile.mkdtemp(prefix="ng_profile_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    row = load_row()
    with FakeLLMBackend("--tool-args", '{"city": "Oslo"}') as backend, running_stack(backend) as servers:
        url = servers["agent"]["url"] + "/run"
        asyncio.run(drive(url, row, 300, args.in_flight))  # warm-up
        spies = {}
        for name, instance in servers.items():
            spies[name] = subprocess.Popen(
                ["py-spy", "record", "--pid", str(instance["pid"]), "--rate", str(args.rate), "--nonblocking",
                 "--format", "raw", "--output", str(out_dir / f"{name}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        asyncio.run(drive(url, row, 50, 1))  # let py-spy attach
        wall, _, failures = asyncio.run(drive(url, row, args.rollouts, args.in_flight))
        for spy in spies.values():
            spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for spy in spies.values():
            spy.wait(timeout=60)

    print(f"{args.rollouts} rollouts at {args.in_flight} in flight: {args.rollouts / wall:.0f} rollouts/s, "
          f"{failures} failures; stacks in {out_dir}")
    for name in spies:
        print(f"\n{name}:")
        print(summarise(out_dir / f"{name}.txt", args.top))


if __name__ == "__main__":
    main()
