"""Scale-out: rollouts/s and stack CPU per rollout with 1, 2 and 4 replicas of the agent and the resources server
running as Ray actors on a local multi-node Ray cluster (docs/design.md, decision 24; docs/scale-out.md).

The stack is rollout_throughput.py's (example_single_tool_call + simple_agent + openai_model over the fake LLM);
the agent and resources server get `num_replicas: N` and `ray_actor_options`, the model server stays a local
process. The load (256 in flight by default) is split evenly over the agent replicas; the agent spreads its
resources-server calls over that server's replicas through `ServerClient` (least in flight, sticky sessions).
"Stack CPU" is the server processes' CPU per rollout; Ray's own processes (raylets, GCS, actor workers) are
reported apart. On a 2-core machine every replica shares the same two cores, so this shows what routing and
the extra processes cost, not a speed-up: the speed-up needs nodes with cores of their own.

    python perf/scale_out.py --rollouts 2000 --replicas 1,2,4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_throughput import AGENT, CONFIGS, REPO, drive, load_row  # noqa: E402

from nemo_gym.runtime.ray import LOOPBACK_RAY_ENV, LocalCluster  # noqa: E402
from nemo_gym.testing.stack import (  # noqa: E402
    FakeLLMBackend,
    NgRunStack,
    cpu_seconds,
    fake_llm_overrides,
    free_port,
    process_tree,
    server_instances,
)

RESOURCES = "example_single_tool_call"
BLOCKS = {
    RESOURCES: f"{RESOURCES}.resources_servers.example_single_tool_call",
    AGENT: f"{AGENT}.responses_api_agents.simple_agent",
}


def replica_overrides(n: int) -> list[str]:
    out = []
    for path in BLOCKS.values():
        out += [f"+{path}.num_replicas={n}", f"+{path}.ray_actor_options={{num_cpus:1}}",
                f"+{path}.scheduling_strategy=SPREAD"]
    return out


def measure(cluster: LocalCluster, backend: FakeLLMBackend, n: int, total: int, in_flight: int) -> dict:
    head_port = free_port()
    overrides = [*fake_llm_overrides(CONFIGS, backend.base_url, head_port), *replica_overrides(n),
                 f"+ray_head_node_address={cluster.address}", "+ray_bind_host=127.0.0.1"]
    t0 = time.perf_counter()
    stack = NgRunStack(overrides, cwd=REPO, env={**LOOPBACK_RAY_ENV, "PYTHONWARNINGS": "ignore"})
    try:
        stack.wait_for("servers ready!", timeout=600)
        ready_s = time.perf_counter() - t0
        instances = server_instances(head_port)
        servers = {f"{i['process_name']}[{i.get('replica', 0)}]": psutil.Process(i["pid"]) for i in instances}
        agent_urls = [i["url"] + "/run" for i in instances if i["process_name"] == AGENT]
        ours = {p.pid for p in servers.values()}
        ray_procs = [p for p in process_tree(cluster.pid) if p.pid not in ours]
        row = load_row()

        async def load(count: int, level: int):
            share = [level // len(agent_urls) + (k < level % len(agent_urls)) for k in range(len(agent_urls))]
            counts = [count // len(agent_urls) + (k < count % len(agent_urls)) for k in range(len(agent_urls))]
            t = time.perf_counter()
            results = await asyncio.gather(*(drive(u, row, c, s) for u, c, s in zip(agent_urls, counts, share)))
            return time.perf_counter() - t, sum(r[2] for r in results)

        asyncio.run(load(100, 32))  # warm-up
        cpu0 = {k: cpu_seconds(p) for k, p in servers.items()}
        ray0 = sum(cpu_seconds(p) for p in ray_procs)
        backend0 = cpu_seconds(psutil.Process(backend.proc.pid))
        wall, failures = asyncio.run(load(total, in_flight))
        stack_cpu = sum(cpu_seconds(p) - cpu0[k] for k, p in servers.items()) * 1000 / total
        ray_cpu = (sum(cpu_seconds(p) for p in ray_procs) - ray0) * 1000 / total
        llm_cpu = (cpu_seconds(psutil.Process(backend.proc.pid)) - backend0) * 1000 / total
        return {"replicas": n, "ready_s": ready_s, "rps": total / wall, "stack_cpu_ms": stack_cpu,
                "ray_cpu_ms": ray_cpu, "llm_cpu_ms": llm_cpu, "failures": failures, "processes": len(servers)}
    finally:
        stack.stop(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000, help="rollouts per replica count")
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="fake LLM latency per call")
    args = parser.parse_args()
    counts = [int(x) for x in args.replicas.split(",") if x]
    biggest = max(counts)
    # Two worker nodes with logical CPUs for every replica (Ray's counts, not cores): SPREAD puts replicas on both.
    nodes = [{"num_cpus": biggest * 2}, {"num_cpus": biggest * 2}]
    results = []
    with LocalCluster(nodes) as cluster:
        with FakeLLMBackend("--tool-args", '{"city": "Oslo"}', "--latency-ms", str(args.latency_ms)) as backend:
            for n in counts:
                results.append(measure(cluster, backend, n, args.rollouts, args.in_flight))
                print(f"  {n} replica(s): {results[-1]['rps']:.0f} rollouts/s", flush=True)

    cores = os.cpu_count() or 0
    print(f"\nScale-out on a local Ray cluster (head + 2 worker nodes), {args.in_flight} in flight, "
          f"{args.rollouts} rollouts per row, fake LLM latency {args.latency_ms:g} ms, {cores} cores")
    print(f"{'replicas':>8} {'ready s':>8} {'rollouts/s':>11} {'stack CPU ms/rollout':>21} {'Ray CPU ms':>11} "
          f"{'LLM CPU ms':>11} {'failures':>9}")
    for r in results:
        print(f"{r['replicas']:>8} {r['ready_s']:>8.1f} {r['rps']:>11.0f} {r['stack_cpu_ms']:>21.2f} "
              f"{r['ray_cpu_ms']:>11.2f} {r['llm_cpu_ms']:>11.2f} {r['failures']:>9}")
    if cores <= 4:
        print(f"\nNote: this machine has {cores} cores, shared by every replica, the fake LLM and the load generator. "
              "The table shows the cost of routing and of more processes on the same cores, not a speed-up; "
              "replicas speed rollouts up when Ray places them on nodes with cores of their own.")


if __name__ == "__main__":
    main()
