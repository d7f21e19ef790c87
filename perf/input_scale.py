"""Memory against input size: peak RSS of the collector and of every server for 1k to 1M input rows.

design.md section 4 asks for "memory flat from 1k to 1M rows". This prints, per input size:

a. the collector's preparation (no stack needed; one subprocess per measurement, its own peak RSS):
   - `fresh`: validate every line (strict params model), materialize the rows with `_ng_task_index` /
     `_ng_rollout_index` (the line digest -> task map) into `<stem>_materialized_inputs.jsonl`, then stream the
     pending rows as a collection would;
   - `resume`: `run_from_config(resume_from_cache=true)` against an output that already holds 99% of the rows
     (repair the tail, read the finished keys, count the cached rows, stream the pending rows and run the 1%
     left over an instant in-process agent; no reward profile);
   - `fresh-dup` / `resume-dup`: the same with an input where every line is one of 1,000 distinct lines.
b. the reward profile (`ng_reward_profile`, also the last step of `ng_collect_rollouts`) of a rollouts file of 1k to
   1M rollouts (4 per task, two agents, lines in a shuffled completion order, a 0/1 reward, a continuous score and
   token counts), one subprocess per size (--profile-sizes);
c. a real collection (`ng_run` of example_single_tool_call + openai_model + simple_agent over the fake LLM, then
   `ng_collect_rollouts` as its own process), sampling every process's RSS during the run (--stack-sizes; the
   stack does a few hundred rollouts per second on 2 cores).

Then the ratio of the largest to the smallest size per column, and the seconds of the 1M-row preparation.

    python perf/input_scale.py                          # prep 1k..1M, stack 1k, 10k, 100k
    python perf/input_scale.py --stack-sizes ''         # preparation and reward profile only
    python perf/input_scale.py --sizes '' --stack-sizes ''   # reward profile only
    python perf/input_scale.py --stack-sizes 1000,10000,100000,1000000   # 1M through the stack (~40 min)

Input rows are the 5 rows of resources_servers/example_single_tool_call/data/example.jsonl, made distinct by a
row number in the user text.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
CONFIGS = [
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "responses_api_models/openai_model/configs/openai_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"
DUP_DISTINCT = 1000
MB = 2**20


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


def _peak_mb() -> float:
    """This process's own peak RSS: VmHWM of its address space. (Not `ru_maxrss`, which Linux keeps across fork and
    exec, so a child would report the parent's RSS at the fork when that is higher - the parent that has just
    written a 1M-row file.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ------------------------------------------------------------------------------------------------ inputs


def write_input(path: Path, n: int, distinct: int | None = None) -> None:
    """`n` lines; line i is example row i % 5 with ` (row k)` added to its user text, k = i (or i % distinct)."""
    import orjson

    base = [orjson.loads(line) for line in EXAMPLE.read_bytes().splitlines() if line.strip()]
    with open(path, "wb") as f:
        for i in range(n):
            k = i if distinct is None else i % distinct
            row = base[k % len(base)]
            msgs = row["responses_create_params"]["input"]
            new_msgs = [
                {**m, "content": f"{m['content']} (row {k})"} if m.get("role") == "user" else m for m in msgs
            ]
            f.write(orjson.dumps({**row, "responses_create_params": {**row["responses_create_params"], "input": new_msgs}}))
            f.write(b"\n")


def write_resumable_output(materialized: Path, output: Path, keep_every: int = 100) -> None:
    """An output holding every materialized row but one in `keep_every`, as short rollout lines."""
    import orjson

    with open(materialized, "rb") as src, open(output, "wb") as dst:
        for i, line in enumerate(src):
            if i % keep_every == keep_every - 1:
                continue
            row = orjson.loads(line)
            dst.write(orjson.dumps({"reward": 1.0, "_ng_task_index": row["_ng_task_index"],
                                    "_ng_rollout_index": row["_ng_rollout_index"]}) + b"\n")


PROFILE_REPEATS = 4


def write_profile_files(materialized: Path, rollouts: Path, n: int) -> None:
    """A materialized-inputs file of n / 4 tasks x 4 rollouts (two agents) and a rollouts file of its n rows in a
    shuffled completion order (windows of 1024 rows), each with a 0/1 reward, a continuous score and usage."""
    import random

    import orjson

    rng = random.Random(n)
    tasks = max(1, n // PROFILE_REPEATS)
    with open(materialized, "wb") as f:
        for t in range(tasks):
            agent = "agent_a" if t % 3 else "agent_b"
            for r in range(PROFILE_REPEATS):
                f.write(orjson.dumps({"responses_create_params": {"input": f"What is {t} + {r}?"},
                                      "agent_ref": {"type": "responses_api_agents", "name": agent},
                                      "expected": t + r, "_ng_task_index": t, "_ng_rollout_index": r}) + b"\n")
    keys = [(t, r) for t in range(tasks) for r in range(PROFILE_REPEATS)]
    with open(rollouts, "wb") as f:
        for lo in range(0, len(keys), 1024):
            window = keys[lo:lo + 1024]
            rng.shuffle(window)
            for t, r in window:
                out = rng.randint(5, 400)
                f.write(orjson.dumps({
                    "response": {"id": f"resp_{t}_{r}", "output": [{"type": "message", "content": "..."}],
                                 "usage": {"input_tokens": 50 + t % 7, "output_tokens": out,
                                           "total_tokens": 50 + t % 7 + out}},
                    "reward": float(rng.random() < 0.6), "score": rng.random(), "correct": rng.random() < 0.5,
                    "_ng_task_index": t, "_ng_rollout_index": r}) + b"\n")


# ------------------------------------------------------------------------------------------------ children


class _InstantAgent:
    status_code = 200
    content = b'{"reward": 1.0}'

    def __init__(self) -> None:
        self.global_config_dict = {AGENT: {"responses_api_agents": {"simple_agent": {}}}}

    async def post(self, server_name, path, json=None, **_):
        return self


def child(kind: str, input_path: Path, out_path: Path) -> None:
    """Run one measurement in this (fresh) process; print a JSON line with baseline, peak and seconds."""
    import asyncio  # noqa: F401  (imports are part of the baseline, not of the growth)

    from nemo_gym.api.schemas import NeMoGymResponseCreateParamsNonStreaming  # noqa: F401
    from nemo_gym.http.client import ServerClient  # noqa: F401
    from nemo_gym.rollouts import collection as c

    baseline = _rss_mb()
    t0 = time.perf_counter()
    if kind == "profile":  # input_path: the materialized inputs, out_path: the rollouts
        from nemo_gym.rollouts.reward_profile import profile_rollouts

        summary = profile_rollouts(input_path, out_path)
        assert summary.num_rollouts == summary.num_tasks * PROFILE_REPEATS, summary
        print(json.dumps({"baseline_mb": baseline, "peak_mb": _peak_mb(), "seconds": time.perf_counter() - t0}))
        return
    paths = c.CollectionPaths(out_path)
    rows = 0
    if kind == "fresh":
        stats = c.materialize_input_file(input_path, paths.materialized_inputs, agent_name=AGENT, known_agents={AGENT})
        for _ in c.iter_pending_rows(paths.materialized_inputs):
            rows += 1
        assert rows == stats.num_rows
    else:
        cfg = c.RolloutCollectionConfig(
            input_jsonl_fpath=str(input_path), output_jsonl_fpath=str(out_path), agent_name=AGENT,
            resume_from_cache=True, progress_bar=False,
        )
        saved = sys.stdout
        sys.stdout = open(os.devnull, "w")
        try:
            code = c.run_from_config(cfg, server_client=_InstantAgent(), profile=False)
        finally:
            sys.stdout = saved
        assert code == 0, code
    seconds = time.perf_counter() - t0
    print(json.dumps({"baseline_mb": baseline, "peak_mb": _peak_mb(), "seconds": seconds}))


def run_child(kind: str, input_path: Path, out_path: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--_child", kind, str(input_path), str(out_path)],
        capture_output=True, text=True, cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child {kind} {input_path} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def prep_measurements(sizes: list[int], tmp: Path) -> dict:
    results: dict[str, dict[int, dict]] = {}
    for n in sizes:
        for dup in (False, True):
            suffix = "-dup" if dup else ""
            src = tmp / f"in{n}{suffix}.jsonl"
            write_input(src, n, DUP_DISTINCT if dup else None)
            out = tmp / f"out{n}{suffix}" / "rollouts.jsonl"
            out.parent.mkdir()
            results.setdefault("fresh" + suffix, {})[n] = run_child("fresh", src, out)
            write_resumable_output(out.with_name("rollouts_materialized_inputs.jsonl"), out)
            results.setdefault("resume" + suffix, {})[n] = run_child("resume", src, out)
            for p in out.parent.iterdir():
                p.unlink()
            src.unlink()
            print(f"  prep {n:>9} rows{suffix}: done", file=sys.stderr, flush=True)
    return results


def profile_measurements(sizes: list[int], tmp: Path) -> dict:
    results: dict[int, dict] = {}
    for n in sizes:
        folder = tmp / f"profile{n}"
        folder.mkdir()
        materialized, rollouts = folder / "r_materialized_inputs.jsonl", folder / "r.jsonl"
        write_profile_files(materialized, rollouts, n)
        results[n] = run_child("profile", materialized, rollouts)
        for p in folder.iterdir():
            p.unlink()
        print(f"  profile {n:>9} rollouts: done", file=sys.stderr, flush=True)
    return results


# ------------------------------------------------------------------------------------------------ the stack


def stack_measurement(n: int, tmp: Path, in_flight: int) -> dict:
    import psutil

    from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port

    src = tmp / f"stack_in{n}.jsonl"
    write_input(src, n)
    out = tmp / f"stack_out{n}" / "rollouts.jsonl"
    head_port = free_port()
    peaks: dict[str, float] = {}
    base: dict[str, float] = {}
    with FakeLLMBackend("--tool-args", '{"city": "Oslo"}') as backend:
        stack = NgRunStack(fake_llm_overrides(CONFIGS, backend.base_url, head_port), cwd=REPO)
        try:
            stack.wait_for("servers ready!", timeout=120)
            from nemo_gym.testing.stack import server_instances

            procs = {i["process_name"].replace("example_single_tool_call_", ""): psutil.Process(i["pid"])
                     for i in server_instances(head_port)}
            procs["ng_run (head)"] = psutil.Process(stack.proc.pid)
            for name, p in procs.items():
                base[name] = peaks[name] = p.memory_info().rss / MB
            t0 = time.perf_counter()
            collector = ChildProcess(
                [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()",
                 f"+head_server.port={head_port}", f"+agent_name={AGENT}", f"+input_jsonl_fpath={src}",
                 f"+output_jsonl_fpath={out}", f"+num_samples_in_parallel={in_flight}", "+progress_bar=false"],
                cwd=REPO, name="ng_collect_rollouts",
            )
            cproc = psutil.Process(collector.proc.pid)
            stop = threading.Event()
            profiling = out.with_name("rollouts_reward_profiling.jsonl")

            def sample() -> None:
                while not stop.is_set():
                    # The collector until its reward profile starts (validation, materialization, rollouts), then
                    # the profile (bounded too: it spills to a temporary SQLite file past 16k rollouts).
                    phase = "collector profile" if profiling.exists() else "collector"
                    for name, p in [(phase, cproc), *procs.items()]:
                        try:
                            rss = p.memory_info().rss / MB
                        except psutil.Error:
                            continue
                        base.setdefault(name, rss)
                        peaks[name] = max(peaks.get(name, 0.0), rss)
                    stop.wait(0.2)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            code = collector.wait(timeout=max(600, n / 20))
            stop.set()
            sampler.join()
            wall = time.perf_counter() - t0
            if code != 0:
                raise SystemExit(f"ng_collect_rollouts exited {code}:\n{collector.tail()}")
            # The collector's own high-water mark (the sampler may miss a short peak).
            lines = sum(1 for _ in open(out, "rb"))
            assert lines == n, (lines, n)
        finally:
            stack.stop(timeout=60)
    for p in out.parent.iterdir():
        p.unlink()
    src.unlink()
    return {"peak": peaks, "base": base, "wall_s": wall, "rps": n / wall}


# ------------------------------------------------------------------------------------------------ report


def _fmt_size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k" if n >= 1000 else str(n)


def print_prep(results: dict) -> None:
    kinds = list(results)
    sizes = sorted(next(iter(results.values())))
    print("\n(a) collector preparation, one process per cell: peak RSS MB (+growth over the process's RSS after "
          "imports), seconds")
    print(f"{'rows':>6} " + " ".join(f"{k:>24}" for k in kinds))
    for n in sizes:
        cells = []
        for k in kinds:
            r = results[k][n]
            cells.append(f"{r['peak_mb']:7.1f} (+{r['peak_mb'] - r['baseline_mb']:6.1f}) {r['seconds']:6.2f}s")
        print(f"{_fmt_size(n):>6} " + " ".join(f"{c:>24}" for c in cells))
    lo, hi = sizes[0], sizes[-1]
    print(f"peak ratio {_fmt_size(hi)}/{_fmt_size(lo)}: " + ", ".join(
        f"{k} {results[k][hi]['peak_mb'] / results[k][lo]['peak_mb']:.2f}x" for k in kinds))
    if hi > lo:
        print(f"growth per input row {_fmt_size(lo)}->{_fmt_size(hi)} (bytes): " + ", ".join(
            f"{k} {((results[k][hi]['peak_mb'] - results[k][lo]['peak_mb']) * MB / (hi - lo)):.1f}" for k in kinds))
    if 1_000_000 in sizes:
        print("1M-row preparation seconds: " + ", ".join(f"{k} {results[k][1_000_000]['seconds']:.1f}" for k in kinds))


def print_profile(results: dict) -> None:
    sizes = sorted(results)
    print("\n(b) reward profile (ng_reward_profile), one process per size: peak RSS MB (+growth over the process's "
          "RSS after imports), seconds")
    for n in sizes:
        r = results[n]
        print(f"{_fmt_size(n):>6} rollouts {r['peak_mb']:7.1f} (+{r['peak_mb'] - r['baseline_mb']:6.1f}) "
              f"{r['seconds']:7.2f}s")
    lo, hi = sizes[0], sizes[-1]
    if hi != lo:
        print(f"peak ratio {_fmt_size(hi)}/{_fmt_size(lo)}: {results[hi]['peak_mb'] / results[lo]['peak_mb']:.2f}x; "
              f"growth per rollout: "
              f"{(results[hi]['peak_mb'] - results[lo]['peak_mb']) * MB / (hi - lo):.1f} bytes")


def print_stack(results: dict) -> None:
    sizes = sorted(results)
    names = list(dict.fromkeys(k for n in sizes for k in results[n]["peak"]))
    print("\n(c) real collection (ng_collect_rollouts + ng_run stack over the fake LLM): peak RSS MB "
          "(+growth over the RSS before the collection; the collector's over its first sample)")
    print(f"{'rows':>6} {'rollouts/s':>10} " + " ".join(f"{n[:20]:>20}" for n in names))
    for n in sizes:
        r = results[n]
        print(f"{_fmt_size(n):>6} {r['rps']:>10.0f} " + " ".join(
            (f"{r['peak'][k]:8.1f} (+{r['peak'][k] - r['base'][k]:6.1f})" if k in r["peak"] else "-").rjust(20)
            for k in names))
    lo, hi = sizes[0], sizes[-1]
    if hi != lo:
        print(f"peak ratio {_fmt_size(hi)}/{_fmt_size(lo)}: " + ", ".join(
            f"{k} {results[hi]['peak'][k] / results[lo]['peak'][k]:.2f}x" for k in names
            if k in results[hi]["peak"] and k in results[lo]["peak"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000", help="input rows for the preparation")
    parser.add_argument("--profile-sizes", default="1000,100000,1000000", help="rollouts for the reward profile")
    parser.add_argument("--stack-sizes", default="1000,10000,100000", help="input rows through a real stack")
    parser.add_argument("--in-flight", type=int, default=256, help="num_samples_in_parallel of the collection")
    parser.add_argument("--tmp", default=None, help="folder for the generated files (default: a temp dir)")
    parser.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        kind, src, out = args._child
        child(kind, Path(src), Path(out))
        return
    sizes = [int(x) for x in args.sizes.split(",") if x]
    stack_sizes = [int(x) for x in args.stack_sizes.split(",") if x]
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="ng_input_scale_") as tmp:
        prep = prep_measurements(sizes, Path(tmp)) if sizes else {}
        if prep:
            print_prep(prep)
        profile_sizes = [int(x) for x in args.profile_sizes.split(",") if x]
        if profile_sizes:
            print_profile(profile_measurements(profile_sizes, Path(tmp)))
        stack = {}
        for n in stack_sizes:
            stack[n] = stack_measurement(n, Path(tmp), args.in_flight)
            print(f"  stack {n:>9} rows: {stack[n]['rps']:.0f} rollouts/s", file=sys.stderr, flush=True)
        if stack:
            print_stack(stack)


if __name__ == "__main__":
    main()
