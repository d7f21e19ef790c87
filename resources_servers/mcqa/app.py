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
  - `lenient_answer_colon_md` (NeMo Gym v0.5; its mmlu, mmlu_pro and gpqa benchmarks set it server-wide): the
    `Answer:` lines may carry markdown emphasis (`**Answer:** C`, `__Answer__: A`, `**Answer: C**`); the **last**
    such line that names one option letter wins (`B because ...` -> B; a list such as `A or B` names none). A row's
    `template_metadata.answer_prefix` (e.g. a translated `Answer:`) is read as one more such marker, and with a
    prefix set a boxed letter is the last resort.

reward = 1.0 iff the extracted letter equals `expected_answer` (case-insensitive), else 0.0.

This is the pattern for any "parse the final answer out of free text" verifier: gather the text, try the
extraction rules in order, compare with the gold answer, and report what was extracted next to the reward so a
bad score can be told apart from a bad parse.
"""

import re
import unicodedata
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


GradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon", "lenient_answer_colon_md"]


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


# ------------------------------------------------------------------------------ lenient_answer_colon_md

# An `Answer:` marker with optional markdown emphasis around the word and after the colon (at most two `*`/`_` on
# each side of the word; after the colon at most two of `*`, `_` or whitespace); the rest of that line follows.
_MD_ANSWER_LINE = re.compile(r"[*_]{0,2}answer[*_]{0,2}\s*:[*_\s]{0,2}(.+)", re.IGNORECASE)
# Characters trimmed from both ends of an answer payload before a letter is read from it.
_PAYLOAD_TRIM = "*_` \t\n\r.,;:"
# Option letters of other scripts and full-width forms that models write for A-D (read as the Latin letter).
_LETTER_LOOKALIKES = str.maketrans(
    {
        "\u0623": " A", "\u0628": " B", "\u062c": " C", "\u062f": " D",  # Arabic alif-hamza, ba, jim, dal
        "\u0985": " A", "\u09ac": " B", "\u09a1": " C", "\u09a2": " D",  # Bengali
        "\uff21": " A", "\uff22": " B", "\uff23": " C", "\uff24": " D",  # full-width A-D
    }
)
# A letter standing alone (no letter right before or after it; digits may touch it).
_LONE_LETTER = re.compile(r"(?<![A-Za-z])([A-Za-z])(?![A-Za-z])")
# What may stand between two letters for them to read as a list of choices: `A/B`, `A, B`, `A or B`, `A B`.
_CHOICE_SEPARATOR = re.compile(r"\s*[/|&,;]\s*|\s+(?:or|and)\s+|\s+", re.IGNORECASE)
_LEADING_LETTER = re.compile(r"([A-Za-z])(?![A-Za-z0-9])")
_WORD_UPPERCASE_LETTER = re.compile(r"\b[A-Z]\b")


def _lookalikes_as_latin(text: str) -> str:
    return unicodedata.normalize("NFKC", text).translate(_LETTER_LOOKALIKES).strip()


def _names_several_choices(text: str, allowed: set[str]) -> bool:
    """True when two different allowed letters stand next to each other separated only by a list separator."""
    found = [(m.group(1).upper(), m.span(1)) for m in _LONE_LETTER.finditer(text) if m.group(1).upper() in allowed]
    return any(
        left != right and _CHOICE_SEPARATOR.fullmatch(text[left_end:right_start]) is not None
        for (left, (_, left_end)), (right, (right_start, _)) in zip(found, found[1:])
    )


def letter_of_payload(payload: str, allowed: set[str]) -> Optional[str]:
    """The option letter an answer payload names: the whole payload when it is one letter, else a letter at its
    start (`B because ...`, `C) Mars`), else the last capital letter standing as a word; None for a list of
    choices or a letter that is not an option."""
    candidate = _lookalikes_as_latin(payload).strip(_PAYLOAD_TRIM)
    if _names_several_choices(candidate, allowed):
        return None
    if len(candidate) == 1:
        letter = candidate
    else:
        leading = _LEADING_LETTER.match(candidate)
        if leading:
            letter = leading.group(1)
        else:
            words = _WORD_UPPERCASE_LETTER.findall(candidate)
            letter = words[-1] if words else None
    if letter and letter.upper() in allowed:
        return letter.upper()
    return None


def answer_payloads(text: str, answer_prefix: Optional[str]) -> list[str]:
    """The rest of the line after each `Answer:` marker (and after each occurrence of `answer_prefix`), in the order
    they appear in the text (NFKC-normalized first)."""
    text = unicodedata.normalize("NFKC", text)
    found = [(m.start(), m.group(1)) for m in _MD_ANSWER_LINE.finditer(text)]
    if answer_prefix:
        prefix = re.compile(re.escape(unicodedata.normalize("NFKC", answer_prefix)) + r"\s*", re.IGNORECASE)
        for m in prefix.finditer(text):
            line_end = text.find("\n", m.end())
            found.append((m.start(), text[m.end() : line_end if line_end >= 0 else len(text)]))
    found.sort(key=lambda item: item[0])
    return [payload for _, payload in found]


def extract_answer_colon_md(text: str, allowed: set[str], answer_prefix: Optional[str]) -> Optional[str]:
    """The last answer payload that names an option letter; with a row prefix set, a boxed letter as a last resort."""
    for payload in reversed(answer_payloads(text, answer_prefix)):
        letter = letter_of_payload(payload, allowed)
        if letter is not None:
            return letter
    if answer_prefix:
        return extract_strict_boxed(text, allowed)
    return None


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
    if body.grading_mode == "lenient_answer_colon_md":
        answer_prefix = (body.template_metadata or {}).get("answer_prefix")
        return extract_answer_colon_md(text, allowed, answer_prefix if isinstance(answer_prefix, str) else None)
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
