"""The policy being trained, served from inside the trainer process: on-policy generation for NeMo Gym agents.

`PolicyServer(model, tokenizer)` runs a small HTTP server on a thread of the trainer process and generates with
`model.generate` on the model's CURRENT weights (the very `torch.nn.Module` the trainer optimizes: no copy, no weight
sync). It speaks the part of vLLM's OpenAI-compatible API that our `vllm_model` server uses in token-in/token-out
training mode (`use_completions_api` + `render_chat_template` + `tokenizer`,
responses_api_models/vllm_model/configs/vllm_model_token_in_token_out.yaml):

* `POST /v1/completions` with a token-id `prompt`: answers the generated text, `token_ids` (the generated ids),
  `prompt_token_ids` (the ids it read) and `logprobs` with `tokens` as `token_id:N` and `token_logprobs`: the log
  prob of each sampled token under the sampling distribution (logits / temperature, as TRL's GRPOTrainer computes its
  per-token log probs).
* `GET /v1/models`, `GET /health`.

So the stack's model server stays our ordinary `vllm_model` (chat template, tool-call parsing, token continuation
across turns, `prompt_token_ids` / `generation_token_ids` / `generation_log_probs` on the output items), and every
agent /run call generates with the policy as it is at that step. `policy_model_overrides()` gives the `ng_run`
overrides that point a stack's `policy_model` at this server.

Requests that arrive together (the agents' concurrent /run calls) are generated as one left-padded batch (up to
`max_batch_size`, gathered for `batch_wait_s`), under `torch.no_grad()` and in eval mode (restored afterwards); each
row is cut at its own EOS / `max_tokens`. A request with a `seed` is generated alone.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import socket
import tempfile
import threading
import time
from pathlib import Path
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Optional, Union

from fastapi import FastAPI, HTTPException, Request

__all__ = ["PolicyServer"]


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: Optional[int]
    future: Future

LOG = logging.getLogger("nemo_gym.policy_server")


class PolicyServer:
    """An in-process, vLLM-compatible `/v1/completions` server generating with a live Hugging Face causal LM.

    `model`: a `transformers` causal LM (the one being trained). `tokenizer`: its tokenizer. `max_new_tokens`: the cap
    on one generation (a request's `max_tokens` is honoured below it). `name`: the model name it answers to.
    `max_batch_size` / `batch_wait_s`: how many concurrent requests one `generate` call takes and how long the first
    waits for others.
    Use as a context manager, or `start()` / `stop()`. `base_url` (`http://127.0.0.1:PORT/v1`) once started.
    `generated`: every generation served so far (prompt ids, generated ids, log probs), for checks and debugging;
    `clear_generated()` empties it."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_new_tokens: int = 256,
        name: str = "policy",
        keep_generated: int = 10_000,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.05,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.host = host
        self.port = port
        self.max_new_tokens = int(max_new_tokens)
        self.name = name
        self.keep_generated = keep_generated
        self.generated: list[dict] = []
        self.max_batch_size = int(max_batch_size)
        self.batch_wait_s = float(batch_wait_s)
        self._lock = threading.Lock()
        self._queue: "queue.Queue[_Request]" = queue.Queue()
        self._worker: Optional[threading.Thread] = None
        self._worker_lock = threading.Lock()
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None
        self._tokenizer_dir: Optional[tempfile.TemporaryDirectory] = None
        eos = getattr(model.generation_config, "eos_token_id", None) if hasattr(model, "generation_config") else None
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos_ids)
        if not self.eos_token_ids:
            raise ValueError("PolicyServer: the tokenizer and the model's generation_config name no EOS token; "
                             "set tokenizer.eos_token (generation would never stop before max_new_tokens).")

    # ------------------------------------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> "PolicyServer":
        import uvicorn

        if self._thread is not None:
            return self
        if not self.port:
            with socket.socket() as s:
                s.bind((self.host, 0))
                self.port = s.getsockname()[1]
        config = uvicorn.Config(self._app(), host=self.host, port=self.port, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # not the main thread: leave the trainer's handlers
        self._thread = threading.Thread(target=self._server.run, name="nemo-gym-policy-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"PolicyServer: the server on {self.url} did not start within {timeout} s "
                                   f"(port taken? see the log above)")
            time.sleep(0.02)
        LOG.info("policy server on %s", self.base_url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout)
            self._worker = None
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = self._server = None
        if self._tokenizer_dir is not None:
            self._tokenizer_dir.cleanup()
            self._tokenizer_dir = None

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def clear_generated(self) -> None:
        self.generated.clear()

    # ------------------------------------------------------------------------------------ the stack's side

    def tokenizer_folder(self) -> str:
        """A local Hugging Face tokenizer folder of this policy (saved once, removed on `stop()`): what the stack's
        `vllm_model` renders the chat template with (`tokenizer:`)."""
        if self._tokenizer_dir is None:
            self._tokenizer_dir = tempfile.TemporaryDirectory(prefix="nemo_gym_policy_tokenizer_")
            self.tokenizer.save_pretrained(self._tokenizer_dir.name)
            if getattr(self.model, "generation_config", None) is not None:
                self.model.generation_config.save_pretrained(self._tokenizer_dir.name)
        return self._tokenizer_dir.name

    def policy_model_overrides(self, model_server: str = "policy_model",
                               tokenizer_folder: Union[str, Path, None] = None) -> list[str]:
        """`ng_run` overrides that make the stack's `model_server` (default `policy_model`) our `vllm_model` in
        token-in/token-out training mode, pointed at this server. Use with no other config for that server."""
        prefix = f"++{model_server}.responses_api_models.vllm_model"
        folder = str(tokenizer_folder or self.tokenizer_folder())
        return [
            f"{prefix}.entrypoint=app.py",
            f"{prefix}.base_url={self.base_url}",
            f"{prefix}.api_key=policy",
            f"{prefix}.model={self.name}",
            f"{prefix}.return_token_id_information=true",
            f"{prefix}.uses_reasoning_parser=false",
            f"{prefix}.use_completions_api=true",
            f"{prefix}.render_chat_template=true",
            f"{prefix}.tokenizer={folder}",
        ]

    # ------------------------------------------------------------------------------------------ generation

    def generate(self, prompt_ids: list[int], *, max_tokens: Optional[int] = None, temperature: float = 1.0,
                 top_p: float = 1.0, seed: Optional[int] = None) -> dict:
        """Generate from `prompt_ids` with the current weights: {"prompt_ids", "ids", "logprobs", "finish_reason"}.
        Requests that arrive together (the agents' concurrent /run calls) are generated as one batch."""
        return self.submit(prompt_ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                           seed=seed).result()

    def submit(self, prompt_ids: list[int], *, max_tokens: Optional[int] = None, temperature: float = 1.0,
               top_p: float = 1.0, seed: Optional[int] = None) -> "Future":
        """`generate` as a `concurrent.futures.Future` (queued for the batching worker)."""
        limit = self.max_new_tokens if max_tokens is None else max(1, min(int(max_tokens), self.max_new_tokens))
        temperature = float(temperature) if temperature is not None else 1.0
        top_p = float(top_p) if top_p is not None else 1.0
        future: Future = Future()
        self._ensure_worker()
        self._queue.put(_Request(list(prompt_ids), limit, temperature, top_p, seed, future))
        return future

    def _ensure_worker(self) -> None:
        with self._worker_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="nemo-gym-policy-generate", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        pending: list[_Request] = []
        while True:
            if not pending:
                request = self._queue.get()
                if request is None:  # stop()
                    return
                pending.append(request)
            deadline = time.monotonic() + self.batch_wait_s
            while len(pending) < 4 * self.max_batch_size:  # gather what arrives together
                try:
                    request = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if request is None:  # stop(): finish what is pending first
                    self._queue.put(None)
                    break
                pending.append(request)
            first = pending[0]
            # One batch: same sampling settings, no per-request seed (a seeded request runs alone, reproducibly).
            batch = [first] if first.seed is not None else [
                r for r in pending if r.seed is None and (r.temperature, r.top_p) == (first.temperature, first.top_p)
            ][: self.max_batch_size]
            pending = [r for r in pending if not any(r is b for b in batch)]
            try:
                results = self._generate_batch(batch)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting request
                for request in batch:
                    request.future.set_exception(exc)
                continue
            for request, result in zip(batch, results):
                self.generated.append(result)
                request.future.set_result(result)
            del self.generated[: max(0, len(self.generated) - self.keep_generated)]

    def _generate_batch(self, batch: list["_Request"]) -> list[dict]:
        import torch

        first = batch[0]
        greedy = first.temperature <= 0.0
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        width = max(len(r.prompt_ids) for r in batch)
        with self._lock:
            model = self.model
            was_training = model.training
            model.eval()
            try:
                device = next(model.parameters()).device
                input_ids = torch.tensor([[pad_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch],
                                         dtype=torch.long, device=device)
                attention_mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids)
                                               for r in batch], dtype=torch.long, device=device)
                if first.seed is not None:
                    torch.manual_seed(int(first.seed))
                with torch.no_grad():
                    out = model.generate(
                        input_ids=input_ids, attention_mask=attention_mask,
                        max_new_tokens=max(r.max_tokens for r in batch), do_sample=not greedy,
                        eos_token_id=self.eos_token_ids, pad_token_id=pad_id, output_logits=True,
                        return_dict_in_generate=True, top_k=0, top_p=1.0 if greedy else first.top_p,
                        temperature=1.0 if greedy else first.temperature,
                    )
            finally:
                model.train(was_training)
        scale = 1.0 if greedy else first.temperature
        results = []
        for row, request in enumerate(batch):
            ids: list[int] = []
            logprobs: list[float] = []
            for step in range(min(request.max_tokens, len(out.logits))):
                token = int(out.sequences[row, width + step])
                logits = out.logits[step][row].float() / scale
                ids.append(token)
                logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
                if token in self.eos_token_ids:
                    break
            finish = "stop" if ids and ids[-1] in self.eos_token_ids else "length"
            results.append({"prompt_ids": request.prompt_ids, "ids": ids, "logprobs": logprobs,
                            "finish_reason": finish})
        return results

    def _app(self) -> Any:
        app = FastAPI(title="NeMo Gym policy server")

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "nemo_gym"}]}

        @app.post("/v1/completions")
        async def completions(request: Request) -> dict:
            body = await request.json()
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
                prompt = prompt[0]
            if isinstance(prompt, str):
                prompt = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
                raise HTTPException(400, "PolicyServer /v1/completions: `prompt` must be a non-empty list of token "
                                         "ids or a string")
            if int(body.get("n") or 1) != 1:
                raise HTTPException(400, "PolicyServer /v1/completions: only n=1 is supported")
            result = await asyncio.wrap_future(self.submit(
                prompt, max_tokens=body.get("max_tokens"), temperature=body.get("temperature", 1.0),
                top_p=body.get("top_p", 1.0), seed=body.get("seed"),
            ))
            ids = result["ids"]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            return {
                "id": f"cmpl-{len(self.generated)}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.name,
                "choices": [{
                    "index": 0,
                    "text": text,
                    "finish_reason": result["finish_reason"],
                    "token_ids": ids,
                    "prompt_token_ids": result["prompt_ids"],
                    "logprobs": {
                        "tokens": [f"token_id:{t}" for t in ids],
                        "token_logprobs": result["logprobs"],
                        "top_logprobs": None,
                    },
                }],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)},
            }

        return app
