"""mcqa: multiple-choice questions graded by the option letter the model picked.

There are no tools: the model answers in text and `verify` extracts a letter from it. How it extracts is chosen
per row (or for all rows by the server's `grading_mode`, when set):

* `template_metadata.output_regex` (optional): a regex written for the prompt template, e.g.
  `Final Choice:\\s*([A-Z])`. It is tried first; when it yields no answer (no match, an invalid pattern, or a
  match that is neither a letter nor an option's text) the grading mode below decides.
* `grading_mode`:
  - `strict_single_letter_boxed` (default): the answer must be `\\boxed{X}` with a single uppercase option letter
    (punctuation and spaces around it are fine: `\\boxed{ (B) }`).
  - `lenient_boxed`: strict first; otherwise the first `\\boxed{...}` may contain the option's *text*
    (`\\boxed{\\text{Paris}}`), as long as exactly one option's text appears in it.
  - `lenient_answer_colon`: the first `Answer: ...` line holds an option letter or exactly an option's text.

reward = 1.0 iff the extracted letter equals `expected_answer` (case-insensitive), else 0.0.

This is the pattern for any "parse the final answer out of free text" verifier: gather the text, try the
extraction rules in order, compare with the gold answer, and report what was extracted next to the reward so a
bad score can be told apart from a bad parse.
"""

import re
from typing import Any, Iterator, Literal, Optional, Union

from fastapi import FastAPI

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.verifiers import latex_answers


GradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"]


class MCQAResourcesServerConfig(BaseResourcesServerConfig):
    # Set (NeMo Gym v0.5's `++mcqa.resources_servers.mcqa.grading_mode=...`), it replaces every row's own mode: a
    # benchmark's prompt template decides the answer format for all of its rows.
    grading_mode: Optional[GradingMode] = None


class MCQARunRequest(BaseRunRequest):
    # The options as single-key dicts in display order: [{"A": "Paris"}, {"B": "Rome"}, ...].
    options: Optional[list[dict[str, Optional[str]]]] = None
    expected_answer: Optional[str] = None  # the correct letter
    grading_mode: GradingMode = "strict_single_letter_boxed"
    # Facts about the prompt template. `output_regex`, when present, extracts the answer before `grading_mode`.
    template_metadata: Optional[dict[str, Any]] = None
    uuid: Optional[Union[str, int]] = None
    metadata: Optional[dict[str, Any]] = None  # free-form, never used for grading


class MCQAVerifyRequest(MCQARunRequest, BaseVerifyRequest):
    pass


class MCQAVerifyResponse(MCQAVerifyRequest, BaseVerifyResponse):
    expected_answer: str  # normalized: stripped and uppercased
    extracted_answer: Optional[str]  # the letter the model picked, or None when nothing could be extracted


# ------------------------------------------------------------------------------------------------------ text


def assistant_text(body: BaseVerifyRequest) -> str:
    """Every `output_text` part of every assistant message, one per line, stripped."""
    return "\n".join(body.response.assistant_texts()).strip()


def normalize(text: str) -> str:
    """Lowercase and collapse runs of whitespace, for comparing option texts."""
    return " ".join(text.lower().split())


def option_items(options: Optional[list[dict[str, Optional[str]]]]) -> list[tuple[str, str]]:
    """(uppercase letter, text) for every option whose key is one letter and whose text is not null."""
    items = []
    for option in options or []:
        for key, text in option.items():
            if len(key) == 1 and key.isalpha() and text is not None:
                items.append((key.upper(), text))
    return items


def boxed_contents(text: str) -> Iterator[str]:
    """The contents of every `\\boxed{...}`, in order, with nested braces balanced (`\\boxed{\\text{B}}` ->
    `\\text{B}`). Reading stops at a box that is never closed."""
    for content in latex_answers.boxed_contents(text):
        if content is None:
            return
        yield content


def strip_text_wrappers(text: str) -> str:
    """`\\text{ \\text{Paris} }` -> `Paris`: removes `\\text{...}` wrappers around the *whole* string.

    Works on indices with the brace pairs found in one pass, so even thousands of nested wrappers (degenerate
    model output) take linear time."""
    closing = latex_answers.brace_pairs(text)
    start, end = 0, len(text)
    while True:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if not (text.startswith("\\text{", start, end) and closing.get(start + len("\\text")) == end - 1):
            return text[start:end]
        start, end = start + len("\\text{"), end - 1


# ------------------------------------------------------------------------------------------------ extraction

# A box holding exactly one letter, uppercase, with only non-letters around it: `B`, ` (B) `, `[C].`
_SINGLE_UPPERCASE_LETTER = re.compile(r"[^A-Za-z]*([A-Z])[^A-Za-z]*")
_ANSWER_COLON = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)


def extract_with_output_regex(text: str, pattern: str, options: list[tuple[str, str]]) -> Optional[str]:
    """The template's own regex, case-insensitive; the **last** match wins (models restate earlier guesses).

    A single letter is accepted as is, even if it is not among the options (the template decides what a valid
    answer looks like); otherwise the match must equal one option's text. An invalid pattern extracts nothing.
    """
    try:
        matches = re.findall(pattern, text, flags=re.IGNORECASE)
    except re.error:
        return None
    if not matches:
        return None
    last = matches[-1]
    if isinstance(last, tuple):  # several groups: the first one that matched something
        last = next((group for group in last if group), "")
    candidate = last.strip()
    if len(candidate) == 1 and candidate.isalpha():
        return candidate.upper()
    wanted = normalize(candidate)
    return next((letter for letter, option_text in options if normalize(option_text) == wanted), None)


def extract_strict_boxed(text: str, allowed: set[str]) -> Optional[str]:
    """The first box that holds a single uppercase letter; that letter must be an option."""
    for content in boxed_contents(text):
        match = _SINGLE_UPPERCASE_LETTER.fullmatch(content)
        if match:
            letter = match.group(1)
            return letter if letter in allowed else None
    return None


def extract_boxed_option_text(text: str, options: list[tuple[str, str]]) -> Optional[str]:
    """Look only in the first box: the option whose text appears in it, if exactly one does."""
    first = next(boxed_contents(text), None)
    if first is None:
        return None
    candidates = {normalize(first), normalize(strip_text_wrappers(first))}
    matched = {
        letter
        for letter, option_text in options
        if normalize(option_text) and any(normalize(option_text) in candidate for candidate in candidates)
    }
    return matched.pop() if len(matched) == 1 else None


def extract_answer_colon(text: str, options: list[tuple[str, str]], allowed: set[str]) -> Optional[str]:
    """The rest of the first `Answer:` line: an option letter (any case) or exactly an option's text."""
    match = _ANSWER_COLON.search(text)
    if not match:
        return None
    candidate = strip_text_wrappers(match.group(1))
    if len(candidate) == 1 and candidate.isalpha() and candidate.upper() in allowed:
        return candidate.upper()
    wanted = normalize(candidate)
    return next((letter for letter, option_text in options if normalize(option_text) == wanted), None)


def extract_letter(text: str, body: MCQARunRequest) -> Optional[str]:
    options = option_items(body.options)
    allowed = {letter for letter, _ in options}

    output_regex = (body.template_metadata or {}).get("output_regex")
    if isinstance(output_regex, str) and output_regex:
        letter = extract_with_output_regex(text, output_regex, options)
        if letter is not None:
            return letter

    if body.grading_mode == "lenient_answer_colon":
        return extract_answer_colon(text, options, allowed)
    letter = extract_strict_boxed(text, allowed)
    if letter is None and body.grading_mode == "lenient_boxed":
        letter = extract_boxed_option_text(text, options)
    return letter


class MCQAResourcesServer(SimpleResourcesServer):
    config: MCQAResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the answer is in the text

    async def verify(self, body: MCQAVerifyRequest) -> MCQAVerifyResponse:
        if self.config.grading_mode is not None:
            body = body.model_copy(update={"grading_mode": self.config.grading_mode})
        extracted = extract_letter(assistant_text(body), body)
        gold = (body.expected_answer or "").strip().upper()
        reward = 1.0 if gold and extracted == gold else 0.0
        return MCQAVerifyResponse(
            **body.model_dump(exclude={"expected_answer"}),
            reward=reward,
            expected_answer=gold,
            extracted_answer=extracted,
        )


if __name__ == "__main__":
    MCQAResourcesServer.run_webserver()
