"""Verifiable instructions: one checker class per instruction kind, and `INSTRUCTION_REGISTRY` (id -> class).

Ids and kwargs names follow the public IFEval benchmark format (`length_constraints:number_words` with
`num_words` and `relation`, ...), so IFEval-style datasets load unchanged. The checking code is this project's.

A checker is used in two steps::

    checker = INSTRUCTION_REGISTRY["keywords:existence"]("keywords:existence")
    checker.build_description(keywords=["river"])  # validates and stores the kwargs, returns the instruction text
    checker.check_following("We camped by the river.")  # -> True

`build_description` takes keyword-only arguments: a missing required one or an unknown one raises `TypeError`,
a value of the wrong type or out of range raises `InstructionArgumentError` (a `ValueError`). Unlike IFEval,
nothing is ever chosen at random: a checker without its kwargs cannot be built.

Adding a kind: subclass `Instruction`, set `instruction_id`, implement both methods, decorate with `@register`.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Optional, TypeVar

from nemo_gym.errors import did_you_mean

from resources_servers.instruction_following.text_utils import (
    case_tokens,
    count_sentences,
    count_words,
    split_on_blank_lines,
    split_on_marker,
)


class InstructionArgumentError(ValueError):
    """A kwarg has the wrong type or an impossible value."""


class Instruction:
    """Base class of the checkers. Subclasses set `instruction_id` and implement both methods."""

    instruction_id: ClassVar[str] = ""

    def __init__(self, instruction_id: Optional[str] = None):
        self.id = instruction_id or self.instruction_id
        self._args: dict[str, Any] = {}

    def build_description(self, **kwargs: Any) -> str:
        """Validate and store the kwargs; return the instruction as it would be put to the model."""
        raise NotImplementedError

    def check_following(self, text: str) -> bool:
        """Whether `text` (the final answer) follows the instruction."""
        raise NotImplementedError

    def get_instruction_args(self) -> dict[str, Any]:
        """The kwargs as stored by `build_description` (normalized)."""
        return dict(self._args)

    def get_instruction_args_keys(self) -> list[str]:
        return list(self._args)


INSTRUCTION_REGISTRY: dict[str, type[Instruction]] = {}

_InstructionT = TypeVar("_InstructionT", bound=type[Instruction])


def register(cls: _InstructionT) -> _InstructionT:
    if not cls.instruction_id or cls.instruction_id in INSTRUCTION_REGISTRY:
        raise ValueError(f"{cls.__name__}: missing or duplicate instruction_id {cls.instruction_id!r}")
    INSTRUCTION_REGISTRY[cls.instruction_id] = cls
    return cls


# ------------------------------------------------------------------------------------------- kwarg validation

RELATIONS = ("less than", "at least")


def _count(name: str, value: Any, minimum: int = 0) -> int:
    """A whole number >= minimum. Integral floats (`300.0`, as some dataset exports store ints) are accepted."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InstructionArgumentError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise InstructionArgumentError(f"{name} must be at least {minimum}, got {value}")
    return value


def _relation(name: str, value: Any) -> str:
    if value not in RELATIONS:
        raise InstructionArgumentError(f"{name} must be one of {list(RELATIONS)}, got {value!r}")
    return value


def _compare(count: int, relation: str, threshold: int) -> bool:
    return count < threshold if relation == "less than" else count >= threshold


def _phrase(name: str, value: Any) -> str:
    """A non-blank string."""
    if not isinstance(value, str) or not value.strip():
        raise InstructionArgumentError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _phrases(name: str, value: Any) -> list[str]:
    """A non-empty list of non-blank strings (a single string is taken as a one-element list)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise InstructionArgumentError(f"{name} must be a non-empty list of strings, got {value!r}")
    return [_phrase(name, item) for item in value]


def _collapse(text: str) -> str:
    """Lowercased, with every run of whitespace turned into one space, stripped."""
    return " ".join(text.lower().split())


def _relation_words(relation: str) -> str:
    return "fewer than" if relation == "less than" else "at least"


# ================================================================================================ length


def divider_paragraphs(text: str, markers: tuple[str, ...] = ("***",)) -> Optional[list[str]]:
    """The paragraphs of a text divided by a standalone markdown divider (`***`, or any of `markers`), stripped.
    An empty piece before the first or after the last divider is ignored; None when a piece between two
    dividers is empty (the paragraph count is then wrong whatever it is asked to be)."""
    pieces = [text]
    for marker in markers:
        pieces = [part for piece in pieces for part in split_on_marker(piece, marker)]
    return separated_pieces(pieces)


def separated_pieces(pieces: list[str]) -> Optional[list[str]]:
    """The stripped non-empty pieces of a text split on a separator; an empty piece before the first or after
    the last separator is ignored, and None when a piece between two separators is empty."""
    kept = []
    for index, piece in enumerate(pieces):
        if piece.strip():
            kept.append(piece.strip())
        elif 0 < index < len(pieces) - 1:
            return None
    return kept


@register
class NumberOfWords(Instruction):
    """Word count compared with a threshold. Words are runs of letters/digits/underscore (`\\w+`)."""

    instruction_id = "length_constraints:number_words"

    def build_description(self, *, num_words: int, relation: str) -> str:
        self._args = {"num_words": _count("num_words", num_words), "relation": _relation("relation", relation)}
        return f"Answer with {_relation_words(relation)} {self._args['num_words']} words."

    def check_following(self, text: str) -> bool:
        return _compare(count_words(text), self._args["relation"], self._args["num_words"])


@register
class NumberOfSentences(Instruction):
    """Sentence count compared with a threshold (see `text_utils.split_sentences`)."""

    instruction_id = "length_constraints:number_sentences"

    def build_description(self, *, num_sentences: int, relation: str) -> str:
        self._args = {
            "num_sentences": _count("num_sentences", num_sentences),
            "relation": _relation("relation", relation),
        }
        return f"Your response should contain {_relation_words(relation)} {self._args['num_sentences']} sentences."

    def check_following(self, text: str) -> bool:
        return _compare(count_sentences(text), self._args["relation"], self._args["num_sentences"])


@register
class NumberOfParagraphs(Instruction):
    """Exactly N paragraphs separated by the markdown divider `***` (standing alone, with whitespace or the
    start/end of the text around it). An empty piece before the first or after the last divider is ignored; an
    empty piece between two dividers fails."""

    instruction_id = "length_constraints:number_paragraphs"

    def build_description(self, *, num_paragraphs: int) -> str:
        self._args = {"num_paragraphs": _count("num_paragraphs", num_paragraphs, minimum=1)}
        count = self._args["num_paragraphs"]
        return f"Write exactly {count} paragraphs, separated from each other by the markdown divider ***."

    def check_following(self, text: str) -> bool:
        paragraphs = divider_paragraphs(text)
        return paragraphs is not None and len(paragraphs) == self._args["num_paragraphs"]


@register
class NthParagraphFirstWord(Instruction):
    """Exactly N paragraphs separated by blank lines, and paragraph `nth_paragraph` (1-based) starts with
    `first_word`. The first word is read after leading punctuation and markdown (`"`, `*`, `#`, ...) and ends at
    the first character that is not a letter, digit, apostrophe or hyphen; compared case-insensitively."""

    instruction_id = "length_constraints:nth_paragraph_first_word"

    _FIRST_WORD = re.compile(r"[^\w]*(\w+(?:['’\-]\w+)*)")

    def build_description(self, *, num_paragraphs: int, nth_paragraph: int, first_word: str) -> str:
        num_paragraphs = _count("num_paragraphs", num_paragraphs, minimum=1)
        nth_paragraph = _count("nth_paragraph", nth_paragraph, minimum=1)
        if nth_paragraph > num_paragraphs:
            raise InstructionArgumentError(f"nth_paragraph ({nth_paragraph}) is after the last ({num_paragraphs})")
        word = self._FIRST_WORD.match(_phrase("first_word", first_word))
        if word is None:
            raise InstructionArgumentError(f"first_word must contain a word, got {first_word!r}")
        self._args = {"num_paragraphs": num_paragraphs, "nth_paragraph": nth_paragraph, "first_word": word.group(1)}
        return (
            f"Write exactly {num_paragraphs} paragraphs separated by blank lines. "
            f"Paragraph {nth_paragraph} must start with the word {word.group(1)}."
        )

    def check_following(self, text: str) -> bool:
        paragraphs = split_on_blank_lines(text)
        if len(paragraphs) != self._args["num_paragraphs"]:
            return False
        match = self._FIRST_WORD.match(paragraphs[self._args["nth_paragraph"] - 1])
        return match is not None and match.group(1).lower() == self._args["first_word"].lower()


# ============================================================================================== keywords


def _contains(text: str, phrase: str) -> bool:
    return phrase.lower() in text.lower()


def count_occurrences(text: str, phrase: str) -> int:
    """Non-overlapping case-insensitive occurrences of `phrase` anywhere (inside longer words too), the IFEval
    keyword counting rule."""
    return text.lower().count(phrase.lower())


def count_whole_words(text: str, phrase: str) -> int:
    """Case-insensitive occurrences of `phrase` as a whole word (or phrase), the IFBench keyword counting rule."""
    return len(_whole_word_pattern(phrase).findall(text))


def _whole_word_pattern(phrase: str) -> re.Pattern:
    """The phrase, case-insensitive, not directly preceded or followed by a letter, digit or underscore; the
    spaces of a multi-word phrase match any run of whitespace."""
    body = r"\s+".join(re.escape(part) for part in phrase.split())
    return re.compile(r"(?<!\w)" + body + r"(?!\w)", re.IGNORECASE)


@register
class KeywordsExistence(Instruction):
    """Every keyword appears in the text (case-insensitive substring, as IFEval: `art` is found in `start`)."""

    instruction_id = "keywords:existence"

    def build_description(self, *, keywords: list[str]) -> str:
        self._args = {"keywords": _phrases("keywords", keywords)}
        return "Include the keywords " + ", ".join(repr(k) for k in self._args["keywords"]) + " in the response."

    def check_following(self, text: str) -> bool:
        return all(_contains(text, keyword) for keyword in self._args["keywords"])


@register
class ForbiddenWords(Instruction):
    """None of the words appears as a whole word (case-insensitive): `cat` is forbidden in `Cat!` but not in
    `category`; `ice cream` is forbidden in `ice  cream` and `Ice\ncream` but not in `ice-cream`."""

    instruction_id = "keywords:forbidden_words"

    def build_description(self, *, forbidden_words: list[str]) -> str:
        self._args = {"forbidden_words": _phrases("forbidden_words", forbidden_words)}
        return "Do not use the words " + ", ".join(repr(w) for w in self._args["forbidden_words"]) + "."

    def check_following(self, text: str) -> bool:
        return not any(_whole_word_pattern(word).search(text) for word in self._args["forbidden_words"])


@register
class KeywordFrequency(Instruction):
    """Non-overlapping case-insensitive occurrences of `keyword` (substring, as IFEval) vs `frequency`."""

    instruction_id = "keywords:frequency"

    def build_description(self, *, keyword: str, frequency: int, relation: str) -> str:
        self._args = {
            "keyword": _phrase("keyword", keyword).strip(),
            "frequency": _count("frequency", frequency),
            "relation": _relation("relation", relation),
        }
        args = self._args
        return f"The word {args['keyword']!r} should appear {_relation_words(relation)} {args['frequency']} times."

    def check_following(self, text: str) -> bool:
        count = count_occurrences(text, self._args["keyword"])
        return _compare(count, self._args["relation"], self._args["frequency"])


@register
class LetterFrequency(Instruction):
    """Occurrences of one letter (case-insensitive, any alphabet) vs `let_frequency`."""

    instruction_id = "keywords:letter_frequency"

    def build_description(self, *, letter: str, let_frequency: int, let_relation: str) -> str:
        if not isinstance(letter, str) or len(letter) != 1 or not letter.isalpha():
            raise InstructionArgumentError(f"letter must be a single letter, got {letter!r}")
        self._args = {
            "letter": letter.lower(),
            "let_frequency": _count("let_frequency", let_frequency),
            "let_relation": _relation("let_relation", let_relation),
        }
        count = self._args["let_frequency"]
        return f"The letter {letter!r} should appear {_relation_words(let_relation)} {count} times."

    def check_following(self, text: str) -> bool:
        count = text.lower().count(self._args["letter"])
        return _compare(count, self._args["let_relation"], self._args["let_frequency"])


# ============================================================================================ letter case


@register
class LowercaseLetters(Instruction):
    """The whole text is lowercase: at least one cased letter and no uppercase one (Python's `str.islower`).
    IFEval also asks a language detector whether the text is English; this checks the case only."""

    instruction_id = "change_case:english_lowercase"

    def build_description(self) -> str:
        return "Your entire response must be in lowercase letters; no capital letters are allowed."

    def check_following(self, text: str) -> bool:
        return text.islower()


@register
class CapitalLetters(Instruction):
    """The whole text is uppercase: at least one cased letter and no lowercase one (Python's `str.isupper`).
    Checks the case only (no language detection)."""

    instruction_id = "change_case:english_capital"

    def build_description(self) -> str:
        return "Your entire response must be in capital letters."

    def check_following(self, text: str) -> bool:
        return text.isupper()


@register
class CapitalWordFrequency(Instruction):
    """Words written entirely in capitals (`NASA`, `I`, `DON'T`) counted and compared with a threshold."""

    instruction_id = "change_case:capital_word_frequency"

    def build_description(self, *, capital_frequency: int, capital_relation: str) -> str:
        self._args = {
            "capital_frequency": _count("capital_frequency", capital_frequency),
            "capital_relation": _relation("capital_relation", capital_relation),
        }
        return (
            f"Words in all capital letters should appear {_relation_words(capital_relation)} "
            f"{self._args['capital_frequency']} times."
        )

    def check_following(self, text: str) -> bool:
        count = sum(1 for token in case_tokens(text) if token.isupper())
        return _compare(count, self._args["capital_relation"], self._args["capital_frequency"])


# ================================================================================================ format


@register
class JsonFormat(Instruction):
    """The whole answer parses as JSON, optionally inside one markdown code fence (```` ```json ... ``` ````)."""

    instruction_id = "detectable_format:json_format"

    _FENCED = re.compile(r"```(?:[\w+\-]*[^\S\n]*\n)?(.*)```", re.DOTALL)

    def build_description(self) -> str:
        return "Wrap your entire output in JSON format; markdown ticks such as ``` may be used."

    def check_following(self, text: str) -> bool:
        body = text.strip()
        fenced = self._FENCED.fullmatch(body)
        if fenced:
            body = fenced.group(1)
        try:
            json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's parser goes
            return False
        return True


@register
class NumberOfBulletLists(Instruction):
    """Exactly N markdown bullet points: lines starting with `*`, `-` or `+` then a space and some text
    (indentation allowed). Horizontal rules (`---`, `***`) and `**bold**` lines are not bullets."""

    instruction_id = "detectable_format:number_bullet_lists"

    _BULLET = re.compile(r"^[^\S\n]*[*+\-][^\S\n]+\S", re.MULTILINE)

    def build_description(self, *, num_bullets: int) -> str:
        self._args = {"num_bullets": _count("num_bullets", num_bullets)}
        count = self._args["num_bullets"]
        return f"Your answer must contain exactly {count} bullet points, such as:\n* first point\n* second point"

    def check_following(self, text: str) -> bool:
        return len(self._BULLET.findall(text)) == self._args["num_bullets"]


@register
class ConstrainedResponse(Instruction):
    """The answer contains exactly one of the fixed options (case-insensitive, so it can be combined with a
    lowercase or capitals instruction)."""

    instruction_id = "detectable_format:constrained_response"

    OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

    def build_description(self) -> str:
        return "Answer with one of the following options: " + ", ".join(f'"{o}"' for o in self.OPTIONS)

    def check_following(self, text: str) -> bool:
        return sum(1 for option in self.OPTIONS if _contains(text, option)) == 1


@register
class NumberOfHighlightedSections(Instruction):
    """At least N highlighted sections in markdown: `*text*` or `**text**` on one line, the text not starting
    or ending with a space (so `2 * 3 * 4` and `* bullet` lines are not highlights)."""

    instruction_id = "detectable_format:number_highlighted_sections"

    _DOUBLE = re.compile(r"(?<!\*)\*\*(?=[^\s*])[^\n*]*?[^\s*]\*\*(?!\*)")
    _SINGLE = re.compile(r"(?<!\*)\*(?=[^\s*])[^\n*]*?[^\s*]\*(?!\*)")

    def build_description(self, *, num_highlights: int) -> str:
        self._args = {"num_highlights": _count("num_highlights", num_highlights)}
        return f"Highlight at least {self._args['num_highlights']} sections with markdown, i.e. *highlighted section*."

    def check_following(self, text: str) -> bool:
        doubles = self._DOUBLE.findall(text)
        singles = self._SINGLE.findall(self._DOUBLE.sub(" ", text))
        return len(doubles) + len(singles) >= self._args["num_highlights"]


@register
class MultipleSections(Instruction):
    """At least N section headers: a line starting (after spaces and markdown `#`, `*`, `_`) with
    `section_spliter` (case-sensitive) followed by a number, e.g. `Section 1` or `## SECTION 2`."""

    instruction_id = "detectable_format:multiple_sections"

    def build_description(self, *, num_sections: int, section_spliter: str = "Section") -> str:
        self._args = {
            "section_spliter": _phrase("section_spliter", section_spliter).strip(),
            "num_sections": _count("num_sections", num_sections),
        }
        splitter = self._args["section_spliter"]
        count = self._args["num_sections"]
        return f"Your response must have {count} sections. Mark the beginning of each with {splitter} X."

    def check_following(self, text: str) -> bool:
        pattern = r"^[#*_ \t\r\f\v]*" + re.escape(self._args["section_spliter"]) + r"[^\S\n]*\d+"
        return len(re.findall(pattern, text, re.MULTILINE)) >= self._args["num_sections"]


@register
class Title(Instruction):
    """A title wrapped in double angular brackets on one line, with some text (and no `<`, `>`) in it:
    `<<Poem of Joy>>`."""

    instruction_id = "detectable_format:title"

    _TITLE = re.compile(r"<<([^\n<>]+)>>")

    def build_description(self) -> str:
        return "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."

    def check_following(self, text: str) -> bool:
        return any(title.strip() for title in self._TITLE.findall(text))


# =============================================================================================== content


@register
class NumberOfPlaceholders(Instruction):
    """At least N placeholders: non-empty square brackets on one line (`[address]`); a markdown link's
    `[text](url)` is not a placeholder."""

    instruction_id = "detectable_content:number_placeholders"

    _PLACEHOLDER = re.compile(r"\[([^\[\]\n]+)\](?!\()")

    def build_description(self, *, num_placeholders: int) -> str:
        self._args = {"num_placeholders": _count("num_placeholders", num_placeholders)}
        count = self._args["num_placeholders"]
        return f"The response must contain at least {count} placeholders in square brackets, like [name]."

    def check_following(self, text: str) -> bool:
        found = [content for content in self._PLACEHOLDER.findall(text) if content.strip()]
        return len(found) >= self._args["num_placeholders"]


@register
class Postscript(Instruction):
    """A line starts (after spaces and markdown `*`, `_`, `#`, `>`) with the postscript marker, compared
    case-insensitively with optional spaces after its periods: `P.S.`, `p. s.`, `**P.P.S**`."""

    instruction_id = "detectable_content:postscript"

    def build_description(self, *, postscript_marker: str = "P.S.") -> str:
        self._args = {"postscript_marker": _phrase("postscript_marker", postscript_marker).strip()}
        return f"At the end of your response, add a postscript starting with {self._args['postscript_marker']}"

    def check_following(self, text: str) -> bool:
        marker = "".join(
            re.escape(char) + (r"[^\S\n]?" if char == "." else "") for char in self._args["postscript_marker"]
        )
        pattern = r"^[^\S\n]*(?:[*_#>]+[^\S\n]*)?" + marker
        return re.search(pattern, text, re.MULTILINE | re.IGNORECASE) is not None


# ============================================================================================= start/end


@register
class EndChecker(Instruction):
    """The answer ends with the phrase: compared lowercased with whitespace runs collapsed, after removing
    surrounding whitespace and double quotes (`"`, `“`, `”`) from the answer."""

    instruction_id = "startend:end_checker"

    def build_description(self, *, end_phrase: str) -> str:
        self._args = {"end_phrase": _phrase("end_phrase", end_phrase)}
        return f"Finish your response with this exact phrase: {end_phrase.strip()}. No other words should follow it."

    def check_following(self, text: str) -> bool:
        return _collapse(text.strip().strip('"“”')).endswith(_collapse(self._args["end_phrase"]))


@register
class StartChecker(Instruction):
    """(This project's kind, not in IFEval.) The answer starts with the phrase: compared lowercased with
    whitespace runs collapsed, after removing surrounding whitespace and double quotes (`"`, `“`, `”`)."""

    instruction_id = "startend:start_checker"

    def build_description(self, *, start_phrase: str) -> str:
        self._args = {"start_phrase": _phrase("start_phrase", start_phrase)}
        return f"Start your response with this exact phrase: {start_phrase.strip()}"

    def check_following(self, text: str) -> bool:
        return _collapse(text.strip().strip('"“”')).startswith(_collapse(self._args["start_phrase"]))


@register
class Quotation(Instruction):
    """The whole answer is wrapped in double quotation marks: `"..."` or `“...”`."""

    instruction_id = "startend:quotation"

    def build_description(self) -> str:
        return "Wrap your entire response with double quotation marks."

    def check_following(self, text: str) -> bool:
        body = text.strip()
        return len(body) >= 2 and (body[0], body[-1]) in {('"', '"'), ("“", "”")}


# ============================================================================================ punctuation


class ForbiddenCharacters(Instruction):
    """Base of the "no X anywhere" instructions: followed when none of `FORBIDDEN` occurs in the text."""

    FORBIDDEN: ClassVar[frozenset[str]] = frozenset()
    DESCRIPTION: ClassVar[str] = ""

    def build_description(self) -> str:
        return self.DESCRIPTION

    def check_following(self, text: str) -> bool:
        return not any(char in self.FORBIDDEN for char in text)


@register
class NoComma(ForbiddenCharacters):
    """No comma anywhere: the ASCII comma and its CJK/fullwidth/Arabic forms (`，`, `、`, `،`, `﹐`)."""

    instruction_id = "punctuation:no_comma"
    FORBIDDEN = frozenset(",，、،﹐")
    DESCRIPTION = "In your entire response, refrain from the use of any commas."


# ============================================================================================ combination


@register
class RepeatPrompt(Instruction):
    """The answer starts by repeating the request word for word (lowercased, whitespace runs collapsed)."""

    instruction_id = "combination:repeat_prompt"

    def build_description(self, *, prompt_to_repeat: str) -> str:
        self._args = {"prompt_to_repeat": _phrase("prompt_to_repeat", prompt_to_repeat)}
        return (
            "First repeat the request word for word without change, then give your answer (do not say anything "
            f"before repeating the request). The request: {prompt_to_repeat}"
        )

    def check_following(self, text: str) -> bool:
        return _collapse(text).startswith(_collapse(self._args["prompt_to_repeat"]))


@register
class TwoResponses(Instruction):
    """Two different responses separated by six asterisks `******`. Empty text before the first or after the
    last separator is ignored; an empty response between separators, a third response, or two responses that
    are the same (after stripping) fail."""

    instruction_id = "combination:two_responses"

    SEPARATOR = "******"

    def build_description(self) -> str:
        return f"Give two different responses, separated by 6 asterisk symbols: {self.SEPARATOR}."

    def check_following(self, text: str) -> bool:
        responses = separated_pieces(text.split(self.SEPARATOR))
        return responses is not None and len(responses) == 2 and responses[0] != responses[1]


# ============================================================================================== language

# The languages the bundled detector (`langdetect`, the detector IFEval grades with) can tell apart, by ISO 639-1
# code; `zh` is accepted for either written Chinese.
LANGUAGE_NAMES = {
    "af": "Afrikaans", "ar": "Arabic", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech",
    "cy": "Welsh", "da": "Danish", "de": "German", "el": "Greek", "en": "English", "es": "Spanish",
    "et": "Estonian", "fa": "Persian", "fi": "Finnish", "fr": "French", "gu": "Gujarati", "he": "Hebrew",
    "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese",
    "kn": "Kannada", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "mk": "Macedonian", "ml": "Malayalam",
    "mr": "Marathi", "ne": "Nepali", "nl": "Dutch", "no": "Norwegian", "pa": "Punjabi", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "so": "Somali",
    "sq": "Albanian", "sv": "Swedish", "sw": "Swahili", "ta": "Tamil", "te": "Telugu", "th": "Thai",
    "tl": "Tagalog", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese", "zh": "Chinese",
    "zh-cn": "Chinese (simplified)", "zh-tw": "Chinese (traditional)",
}

_detector_factory = None


def detect_language(text: str) -> str:
    """The language code `langdetect` gives the text, with a fixed seed so the same text always gets the same
    answer. Raises ImportError when langdetect is not installed (it is in this server's requirements.txt)."""
    global _detector_factory
    if _detector_factory is None:
        from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory

        factory = DetectorFactory()
        factory.load_profile(PROFILES_DIRECTORY)
        factory.seed = 0
        _detector_factory = factory
    detector = _detector_factory.create()
    detector.append(text)
    return detector.detect()


@register
class ResponseLanguage(Instruction):
    """The whole answer is in `language` (an ISO 639-1 code such as `en`, `fr`, `ja`), as told by the `langdetect`
    detector IFEval uses. An answer with no letters at all is not in any language: it fails (IFEval, whose
    detector raises on such text, counted it as followed)."""

    instruction_id = "language:response_language"

    def build_description(self, *, language: str) -> str:
        if not isinstance(language, str) or language.strip().lower() not in LANGUAGE_NAMES:
            raise InstructionArgumentError(
                f"language must be one of the ISO 639-1 codes {sorted(LANGUAGE_NAMES)}, got {language!r}"
            )
        self._args = {"language": language.strip().lower()}
        name = LANGUAGE_NAMES[self._args["language"]]
        return f"Your ENTIRE response should be in {name} language, no other language is allowed."

    def check_following(self, text: str) -> bool:
        if not any(char.isalpha() for char in text):
            return False
        detected = detect_language(text)
        wanted = self._args["language"]
        return detected == wanted or (wanted == "zh" and detected.startswith("zh-"))


# ================================================================================================ grading

CheckResult = tuple[bool, Optional[str]]


class InstructionValidationError(ValueError):
    """An instruction of a row cannot be built: unknown id, or kwargs it does not accept."""


def build_instruction(instruction_id: str, kwargs: Optional[dict[str, Any]]) -> Instruction:
    """The checker for one instruction, built with its non-null kwargs. Raises InstructionValidationError saying
    what is wrong (an unknown id comes with the closest known id, if any)."""
    cls = INSTRUCTION_REGISTRY.get(instruction_id)
    if cls is None:
        if instruction_id in NOT_SUPPORTED:
            raise InstructionValidationError(f"instruction {instruction_id!r} is {NOT_SUPPORTED[instruction_id]}")
        hint = did_you_mean(str(instruction_id), INSTRUCTION_REGISTRY)
        raise InstructionValidationError(f"unknown instruction id {instruction_id!r}" + ("." + hint if hint else ""))
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InstructionValidationError(f"invalid kwargs for {instruction_id}: expected an object, got {kwargs!r}")
    args = {key: value for key, value in (kwargs or {}).items() if value is not None}
    checker = cls(instruction_id)
    try:
        checker.build_description(**args)
    except (TypeError, ValueError) as error:
        raise InstructionValidationError(f"invalid kwargs for {instruction_id}: {_describe(error)}") from None
    return checker


def check_instruction(instruction_id: str, kwargs: Optional[dict[str, Any]], text: str) -> CheckResult:
    """Build the checker for one instruction with its non-null kwargs and check the text.

    Returns (followed, error): error is None when the instruction was checked, otherwise why it could not be
    (unknown id, bad kwargs, a checker failure) and followed is False. Never raises. Requests are validated
    before grading (`validate_instructions`), so an unknown id or bad kwargs only get here when a caller skips
    that."""
    try:
        checker = build_instruction(instruction_id, kwargs)
    except InstructionValidationError as error:
        return False, str(error)
    try:
        return bool(checker.check_following(text)), None
    except Exception as error:  # a checker bug fails this instruction, not the whole verify call
        return False, f"{instruction_id} failed while checking: {type(error).__name__}: {error}"


def validate_instructions(
    instruction_ids: list[str], kwargs_list: Optional[list[Optional[dict[str, Any]]]], row_id: Any = None
) -> None:
    """Raise InstructionValidationError listing every instruction of a row that cannot be built: each problem
    names its position, the id, the row id (when the row has one) and, for an unknown id, the closest known id."""
    kwargs_list = kwargs_list or []
    row = f" (row id {row_id!r})" if row_id is not None else ""
    problems = []
    for index, instruction_id in enumerate(instruction_ids):
        kwargs = kwargs_list[index] if index < len(kwargs_list) else None
        try:
            build_instruction(instruction_id, kwargs)
        except InstructionValidationError as error:
            problems.append(f"instruction_id_list[{index}]{row}: {error}")
    if problems:
        raise InstructionValidationError(
            "; ".join(problems)
            + " (the supported ids and their kwargs: resources_servers/instruction_following/README.md)"
        )


# Ids of the IFBench families this server knows but cannot grade offline, with the reason. They are rejected at
# validation time like unknown ids, with the reason in the message.
NOT_SUPPORTED = {
    "words:start_verb": "not supported: it needs a part-of-speech tagger model, and none is bundled",
}


def _describe(error: Exception) -> str:
    # TypeError from a signature mismatch reads "NumberOfWords.build_description() got an unexpected ...":
    # drop the method name, the id in the message already says which checker it is.
    return re.sub(r"^\w+\.build_description\(\) ", "", str(error))


# The IF-RLVR training families and the IFBench families register themselves on import; they build on the
# helpers above, so they are imported last.
from resources_servers.instruction_following import ifbench, ifeval_train  # noqa: E402,F401
