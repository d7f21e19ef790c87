"""Builders for the rules of a fake-LLM script (the rule format is in `nemo_gym.testing.fake_openai_server`).

    SCRIPT = [
        answer_rule("shortest year", r"Mercury is closest to the Sun. \\boxed{B}"),
        steps_rule("Add 3", step(tool_call("increment_counter", {"count": 3})), step("The counter is 3.")),
        rule("I could not complete that.", name="after the calls", tool_outputs={"min": 1}),
    ]

Output items use the script's shorthands: a string is an assistant message, `tool_call(...)` a function call
(ids are filled in by the fake backend). `match` keywords are the script's match conditions (`tool_outputs`,
`last_user_regex`, `last_tool_output_contains`, ...).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

__all__ = ["answer_rule", "answer_rules", "rule", "step", "steps_rule", "tool_call"]


def tool_call(name: str, arguments: Any) -> dict:
    """A function-call output item; `arguments` is sent verbatim when it is a string (malformed JSON too), else
    as JSON."""
    return {"type": "function_call", "name": name, "arguments": arguments}


def step(*output: Any) -> dict:
    """One model reply made of these output items (for `steps_rule`)."""
    return {"output": list(output)}


def rule(*output: Any, name: Optional[str] = None, **match: Any) -> dict:
    """The rule that answers with `output` whenever all `match` conditions hold."""
    named = {"name": name} if name else {}
    return {**named, "match": match, "output": list(output)}


def answer_rule(user_part: str, *output: Any, name: Optional[str] = None, **match: Any) -> dict:
    """`rule(*output)` for conversations whose last user message contains `user_part` (and where the further
    `match` conditions hold, e.g. `tool_outputs=0`); named `user_part` unless `name` is given."""
    return rule(*output, name=name or user_part, last_user_contains=user_part, **match)


def answer_rules(replies: Mapping[str, str], name_prefix: str = "") -> list[dict]:
    """One `answer_rule(user_part, text)` per item of `replies`, named `<name_prefix><user_part>`."""
    return [answer_rule(user_part, text, name=name_prefix + user_part) for user_part, text in replies.items()]


def steps_rule(user_part: str, *steps: dict, name: Optional[str] = None, **match: Any) -> dict:
    """The rule that, for a last user message containing `user_part`, answers model call k of the turn with
    `steps[k - 1]` (each a `step(...)`); named `user_part` unless `name` is given."""
    return {"name": name or user_part, "match": {"last_user_contains": user_part, **match}, "replies": list(steps)}
