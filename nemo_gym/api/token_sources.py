"""The token data of a training-mode chat answer (vllm_model with `return_token_id_information: true`), read from
whichever source the upstream sent, in NeMo Gym v0.5's order, without a Python loop per token where the ids come as
an array.

Sources; the first one present wins:

1. ``message``: the bundle NeMo RL's vLLM server attaches to ``choices[0].message``: ``prompt_token_ids``,
   ``generation_token_ids`` and ``generation_log_probs``. Taken as given. Streamed, the same fields on the chunks'
   ``delta`` (the generated ids and log probs spread over the chunks, the prompt's ids on one of them), as this
   server's own streamed chat answers carry them.
2. ``engine``: vLLM's ``return_token_ids`` (vLLM >= 0.10.2): the top-level ``prompt_token_ids`` with
   ``choices[0].token_ids``; only the log probs are read from ``choices[0].logprobs.content`` (its ``logprob``
   floats).
3. ``logprobs``: ``choices[0].logprobs.content`` alone, its tokens ``token_id:<n>`` (``return_tokens_as_token_ids``).
   The prompt's ids are then the caller's to get (``TokenBundle.prompt_token_ids`` is None: the upstream's
   ``POST /tokenize``).

Refused, as v0.5 refuses them, with a :class:`TokenSourceError` (the model server answers HTTP 502) that names the
fields: a bundle with only some of its three fields; ``prompt_token_ids`` without ``choices[0].token_ids`` or the
other way round (a stream may carry the prompt's ids alone: older vLLM streams them without ``token_ids``, so the
generated ids then come from the logprobs); a field that is not a list; generated ids and log probs of different
lengths; a bundle that disagrees with the engine's ids, or engine ids that disagree with the ``token_id:<n>`` tokens;
more than one choice; no source at all. A null field counts as absent. Every check is on whole lists (a length, a
list equality, one comparison of two joined strings), never a Python loop per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from nemo_gym.api.chat_conversion import (
    TOKEN_FIELDS,
    generation_tokens_from_logprobs,
    log_probs_of_logprobs,
    logprob_tokens_match,
)

__all__ = ["MESSAGE", "ENGINE", "LOGPROBS", "TokenSourceError", "TokenBundle", "TokenSources"]

MESSAGE, ENGINE, LOGPROBS = "message", "engine", "logprobs"
_PROMPT, _GENERATION, _LOG_PROBS = TOKEN_FIELDS
_BUNDLE_HINT = (
    "An upstream that attaches the token bundle to the message (NeMo RL's vLLM server) must send all three of "
    "prompt_token_ids, generation_token_ids and generation_log_probs, as lists of equal generated length."
)
_ENGINE_HINT = (
    "vLLM >= 0.10.2 asked with return_token_ids sends both (the top-level prompt_token_ids and each choice's "
    "token_ids); fix the upstream or its proxy so it passes both on, or neither."
)


class TokenSourceError(ValueError):
    """An upstream answer whose token data is partial, conflicting or missing: the upstream's fault, answered by the
    model server with HTTP 502 (a bad gateway) and this message."""


@dataclass
class TokenBundle:
    """The token data of one call. `prompt_token_ids` is None when the upstream sent none (source `logprobs`):
    the caller asks the upstream's /tokenize."""

    prompt_token_ids: Optional[list]
    generation_token_ids: list
    generation_log_probs: list
    source: str
    routed_experts: Any = None


def _first(value: Any, fallback: Any) -> Any:
    return value if value is not None else fallback


class TokenSources:
    """The token data of one upstream answer: :meth:`take` the whole completion, or each streamed chunk in turn
    (`streamed=True`), then :meth:`resolve`. `take` removes the transport fields from the payload (the top-level and
    choice `prompt_token_ids`, the choice's `token_ids`, `routed_experts` wherever it is, the bundle fields of the
    message or delta), so the server sends the resolved data once, on its own message; the choice's `logprobs` are
    read, not removed. `owner` (the server's name) starts every error message."""

    def __init__(self, owner: str, *, streamed: bool = False) -> None:
        self.owner = owner
        self.streamed = streamed
        self._bundle: dict[str, Any] = {}
        self._prompt: Optional[list] = None
        self._ids: Optional[list] = None
        self._logprobs: Optional[list] = None
        self._routed: Any = None
        self._chunk: tuple = (None, None, None, None)
        self._emitted: Optional[int] = None

    # -- gathering ------------------------------------------------------------------------------------------

    def take(self, payload: dict) -> None:
        """Gather the token data of `payload` (a chat completion, or a chunk when streamed)."""
        prompt = self._list(payload.pop("prompt_token_ids", None), "prompt_token_ids")
        routed = payload.pop("routed_experts", None)
        choices = payload.get("choices") or ()
        if len(choices) > 1 or any(isinstance(c, dict) and c.get("index", 0) != 0 for c in choices):
            raise self._error(
                f"the upstream answered {'a chunk of ' if self.streamed else ''}choice index "
                f"{sorted(c.get('index', 0) for c in choices if isinstance(c, dict))}; training mode reads the token "
                f"data of exactly one choice per request (n=1)."
            )
        self._chunk = (None, None, None, None)
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            prompt = _first(self._list(choice.pop("prompt_token_ids", None), "choices[0].prompt_token_ids"), prompt)
            routed = _first(choice.pop("routed_experts", None), routed)
            ids = self._list(choice.pop("token_ids", None), "choices[0].token_ids")
            where = self._where
            message = choice.get("delta" if self.streamed else "message")
            generation = log_probs = None
            if isinstance(message, dict):
                routed = _first(message.pop("routed_experts", None), routed)
                bundle_prompt = self._list(message.pop(_PROMPT, None), f"{where}.{_PROMPT}")
                generation = self._list(message.pop(_GENERATION, None), f"{where}.{_GENERATION}")
                log_probs = self._list(message.pop(_LOG_PROBS, None), f"{where}.{_LOG_PROBS}")
                if bundle_prompt is not None:
                    self._bundle[_PROMPT] = bundle_prompt
                for field, value in ((_GENERATION, generation), (_LOG_PROBS, log_probs)):
                    if value is not None:
                        self._bundle[field] = self._joined(self._bundle.get(field), value)
            logprobs = choice.get("logprobs")
            content = logprobs.get("content") if isinstance(logprobs, dict) else None
            content = content if isinstance(content, list) else None
            self._ids = self._joined(self._ids, ids)
            self._logprobs = self._joined(self._logprobs, content)
            self._chunk = (generation, log_probs, ids, content)
        if prompt is not None:
            self._prompt = prompt
        if routed is not None:
            self._routed = routed

    def chunk_generation(self) -> Optional[tuple[list, list]]:
        """Streamed: the generated ids and log probs the last chunk taken adds, from its best source (its delta's
        bundle fields, else its `token_ids` with its logprobs' floats, else its `token_id:<n>` logprobs); None when
        it adds none. :meth:`resolve` then checks that the chunks added up to the whole."""
        generation, log_probs, ids, content = self._chunk
        if generation is not None or log_probs is not None:
            out = (generation or [], log_probs or [])
        elif ids is not None:
            if content is None or len(content) != len(ids):
                raise self._error(
                    f"a chunk carries {len(ids)} choices[0].token_ids but "
                    f"{'no' if content is None else len(content)} choices[0].logprobs.content entries; training "
                    f"mode needs one log prob per generated token (the request asks logprobs: true)."
                )
            out = (ids, self._log_probs(content))
        elif content is not None:
            out = self._parsed(content)
        else:
            return None
        self._emitted = (self._emitted or 0) + len(out[0])
        return out

    # -- reading ----------------------------------------------------------------------------------------------

    def resolve(self) -> TokenBundle:
        """The call's token data from the first source present (module docstring); TokenSourceError when the
        sources are partial, conflict or are all missing."""
        where = self._where
        if self._bundle:
            missing = [f"{where}.{f}" for f in TOKEN_FIELDS if f not in self._bundle]
            if missing:
                present = [f"{where}.{f}" for f in TOKEN_FIELDS if f in self._bundle]
                raise self._error(
                    f"the upstream's answer has a partial token bundle: {', '.join(present)} but not "
                    f"{', '.join(missing)}. {_BUNDLE_HINT}"
                )
            prompt, ids, log_probs = (self._bundle[f] for f in TOKEN_FIELDS)
            if len(ids) != len(log_probs):
                raise self._error(
                    f"the upstream's answer has {len(ids)} {where}.{_GENERATION} but {len(log_probs)} "
                    f"{where}.{_LOG_PROBS}. {_BUNDLE_HINT}"
                )
            self._check_engine_pair()
            for field, engine, mine, mine_field in (("prompt_token_ids", self._prompt, prompt, _PROMPT),
                                                    ("choices[0].token_ids", self._ids, ids, _GENERATION)):
                if engine is not None and engine != mine:
                    raise self._error(
                        f"the upstream's answer carries token ids twice and they disagree: {field} "
                        f"({len(engine)} ids) is not {where}.{mine_field} ({len(mine)} ids). Fix the upstream so "
                        f"both describe the same call, or send only one."
                    )
            source = MESSAGE
        else:
            self._check_engine_pair()
            prompt = self._prompt
            if self._ids is not None:
                ids, content = self._ids, self._logprobs
                if content is None or len(content) != len(ids):
                    raise self._error(
                        f"the upstream's answer has {len(ids)} choices[0].token_ids but "
                        f"{'no' if content is None else len(content)} choices[0].logprobs.content entries; training "
                        f"mode needs one log prob per generated token (the request asks logprobs: true)."
                    )
                if not logprob_tokens_match(content, ids):
                    raise self._error(
                        "the upstream's choices[0].token_ids disagree with the tokens of choices[0].logprobs.content "
                        "(or those are not `token_id:<n>`: the upstream ignored return_tokens_as_token_ids: true). "
                        "Fix the upstream so both describe the same generation."
                    )
                log_probs, source = self._log_probs(content), ENGINE
            elif self._logprobs is not None:
                ids, log_probs = self._parsed(self._logprobs)
                source = LOGPROBS
            else:
                raise self._error(
                    f"the upstream's answer carries no token data: no {where}.{_GENERATION} bundle, no "
                    f"choices[0].token_ids and no choices[0].logprobs.content. Training mode needs an upstream that "
                    f"returns them: NeMo RL's vLLM server, or vLLM (which honours logprobs: true, "
                    f"return_tokens_as_token_ids and return_token_ids)."
                )
        if self._emitted is not None and self._emitted != len(ids):
            raise self._error(
                f"the upstream's stream mixed token sources: its chunks add up to {self._emitted} generated ids but "
                f"its {source} source has {len(ids)}. Send one source in every chunk."
            )
        return TokenBundle(prompt, ids, log_probs, source, self._routed)

    # -- helpers ----------------------------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        return "choices[0].delta" if self.streamed else "choices[0].message"

    def _error(self, text: str) -> TokenSourceError:
        return TokenSourceError(f"{self.owner}: {text}")

    def _list(self, value: Any, field: str) -> Optional[list]:
        if value is None or isinstance(value, list):
            return value
        raise self._error(
            f"the upstream's {field} must be a list, got {type(value).__name__} ({str(value)[:80]!r})."
        )

    def _joined(self, gathered: Optional[list], value: Optional[list]) -> Optional[list]:
        """A whole answer's list as it is (no copy); a stream's pieces appended to one list of our own."""
        if value is None:
            return gathered
        if not self.streamed:
            return value
        if gathered is None:
            return list(value)
        gathered.extend(value)
        return gathered

    def _check_engine_pair(self) -> None:
        if self.streamed or (self._prompt is None) == (self._ids is None):
            return
        has, lacks = (("prompt_token_ids", "choices[0].token_ids") if self._ids is None
                      else ("choices[0].token_ids", "the top-level prompt_token_ids"))
        raise self._error(f"the upstream's answer has {has} but not {lacks}: partial engine token ids. {_ENGINE_HINT}")

    def _log_probs(self, content: list) -> list:
        try:
            return log_probs_of_logprobs(content)
        except ValueError as exc:
            raise self._error(str(exc)) from None

    def _parsed(self, content: list) -> tuple[list, list]:
        try:
            return generation_tokens_from_logprobs({"content": content})
        except ValueError as exc:
            raise self._error(str(exc)) from None
