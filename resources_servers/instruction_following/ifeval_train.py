"""The IF-RLVR training families: the instruction kinds that open-instruct's "IFEvalG" set adds to IFEval (copying,
first/last words, counting, letters, palindromes, ...). NeMo Gym v0.2's instruction_following data uses these ids
next to the IFEval ones, with the same kwargs names.

Every rule is written from what the instruction tells the model; where the reference scorer reads an instruction
differently, README.md says which reading is used here and why. Counting relations are the IFEval ones:
`"less than"` is count < N, `"at least"` is count >= N.
"""

from __future__ import annotations

import re
from typing import Any

from resources_servers.instruction_following.instructions import (
    ForbiddenCharacters,
    Instruction,
    InstructionArgumentError,
    KeywordFrequency,
    LetterFrequency,
    _collapse,
    _compare,
    _count,
    _phrase,
    _relation,
    _relation_words,
    _whole_word_pattern,
    count_occurrences,
    divider_paragraphs,
    register,
    separated_pieces,
)
from resources_servers.instruction_following.text_utils import (
    bare_words,
    edge_words,
    joined_words,
    split_on_blank_lines,
    split_sentences,
    trim_punctuation,
)


def single_word(name: str, value: Any) -> str:
    """A word kwarg: a non-blank string, or a list holding one (some exports wrap it), trimmed of punctuation."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    word = trim_punctuation(_phrase(name, value))
    if not word:
        raise InstructionArgumentError(f"{name} must contain a word, got {value!r}")
    return word


def same_text(answer: str, expected: str) -> bool:
    """Equal up to letter case and runs of whitespace."""
    return _collapse(answer) == _collapse(expected)


class CountArgument(Instruction):
    """Base of the instructions whose one kwarg is a whole number (`N` or `small_n`, at least `MINIMUM`):
    `DESCRIPTION` is a template with `{n}`, and `self.n` holds the number for `check_following`."""

    MINIMUM = 0
    DESCRIPTION = ""

    def _store(self, name: str, value: Any) -> str:
        self.n = _count(name, value, self.MINIMUM)
        self._args = {name: self.n}
        return self.DESCRIPTION.format(n=self.n)


class NArgument(CountArgument):
    def build_description(self, *, N: int) -> str:
        return self._store("N", N)


class SmallNArgument(CountArgument):
    def build_description(self, *, small_n: int) -> str:
        return self._store("small_n", small_n)


# ================================================================================================== copy


class CopyRequest(Instruction):
    """The answer is the request itself and nothing else (letter case and runs of whitespace ignored)."""

    DESCRIPTION = ""

    def build_description(self, *, prompt_to_repeat: str) -> str:
        self._args = {"prompt_to_repeat": _phrase("prompt_to_repeat", prompt_to_repeat)}
        return self.DESCRIPTION

    def check_following(self, text: str) -> bool:
        return same_text(text, self._args["prompt_to_repeat"])


@register
class Copy(CopyRequest):
    """The answer is the instruction copied word for word (letter case and runs of whitespace ignored)."""

    instruction_id = "copy:copy"
    DESCRIPTION = (
        "Copy the instruction word for word into your answer, without following it and without adding "
        "anything."
    )


@register
class CopyingSimple(CopyRequest):
    """The answer is the request repeated word for word and nothing else (letter case and runs of whitespace
    ignored)."""

    instruction_id = "copy:copying_simple"
    DESCRIPTION = "Repeat the request word for word and do not answer it; say nothing before or after it."


@register
class CopyingMultiple(Instruction):
    """The request repeated exactly N times, the copies separated by six asterisks `******`; nothing else. An
    empty piece before the first or after the last separator is ignored, an empty piece between two fails."""

    instruction_id = "copy:copying_multiple"

    def build_description(self, *, prompt_to_repeat: str, N: int) -> str:
        self._args = {"prompt_to_repeat": _phrase("prompt_to_repeat", prompt_to_repeat), "N": _count("N", N, 1)}
        return f"Repeat the request word for word {self._args['N']} times, separated by ******, and do not answer it."

    def check_following(self, text: str) -> bool:
        copies = separated_pieces(text.split("******"))
        return (
            copies is not None
            and len(copies) == self._args["N"]
            and all(same_text(copy, self._args["prompt_to_repeat"]) for copy in copies)
        )


class PromptSpan(Instruction):
    """Base of the copy-a-span instructions: the answer is the part of `prompt_to_repeat` from index `n_start` to
    index `n_end` (0-based, both included) and nothing else (letter case and runs of whitespace ignored). The
    indices count characters, or whitespace-separated words when `WORDS` is set."""

    WORDS = False

    def units(self, prompt: str) -> list[str]:
        return prompt.split() if self.WORDS else list(prompt)

    @property
    def unit_name(self) -> str:
        return "words" if self.WORDS else "characters"

    def build_description(self, *, prompt_to_repeat: str, n_start: int, n_end: int) -> str:
        prompt = _phrase("prompt_to_repeat", prompt_to_repeat)
        start, end, size = _count("n_start", n_start), _count("n_end", n_end), len(self.units(prompt))
        if end < start or start >= size:
            raise InstructionArgumentError(
                f"need 0 <= n_start <= n_end and n_start inside the prompt ({size} {self.unit_name}), "
                f"got n_start={start}, n_end={end}"
            )
        self._args = {"prompt_to_repeat": prompt, "n_start": start, "n_end": end}
        unit = self.unit_name
        return f"Copy the {unit} of the request from index {start} to index {end} (both included), nothing else."

    def spans(self) -> list[str]:
        units = self.units(self._args["prompt_to_repeat"])
        return [(" " if self.WORDS else "").join(units[self._args["n_start"] : self._args["n_end"] + 1])]

    def check_following(self, text: str) -> bool:
        return any(same_text(text, span) for span in self.spans() if span.strip())


@register
class CopySpanByIndex(PromptSpan):
    """The span of the request between character indices `n_start` and `n_end`. The instruction says "including"
    the end index and the reference scorer cut the span before it: both spans are accepted."""

    instruction_id = "new:copy_span_idx"

    def spans(self) -> list[str]:
        prompt, start, end = self._args["prompt_to_repeat"], self._args["n_start"], self._args["n_end"]
        return super().spans() + [prompt[start:end]]


@register
class RepeatPhrase(Instruction):
    """The phrase written exactly `small_n` times, each time with exactly one of its inner words (not the first,
    not the last) replaced. A copy is a run of as many words as the phrase that starts with its first word and
    ends with its last (case-insensitive, punctuation at word ends ignored); there must be `small_n` such runs
    and every one of them must differ from the phrase in exactly one inner word."""

    instruction_id = "copy:repeat_phrase"

    def build_description(self, *, phrase: str, small_n: int) -> str:
        words = [word.lower() for word in edge_words(_phrase("phrase", phrase))]
        if len(words) < 3:
            raise InstructionArgumentError(f"phrase must have at least 3 words (one in the middle), got {phrase!r}")
        self._args = {"phrase": phrase.strip(), "small_n": _count("small_n", small_n, 1)}
        self._words = words
        return (
            f"Repeat the phrase {self._args['phrase']!r} exactly {self._args['small_n']} times, changing it slightly "
            "each time by replacing only one word in the middle of the phrase."
        )

    def check_following(self, text: str) -> bool:
        phrase = self._words
        words = [word.lower() for word in edge_words(text)]
        copies = 0
        for start in range(len(words) - len(phrase) + 1):
            window = words[start : start + len(phrase)]
            if window[0] != phrase[0] or window[-1] != phrase[-1]:
                continue
            changed = sum(1 for got, wanted in zip(window[1:-1], phrase[1:-1]) if got != wanted)
            if changed != 1:
                return False
            copies += 1
        return copies == self._args["small_n"]


# ================================================================================================ format


@register
class SentenceHyphens(Instruction):
    """The sentences are joined by hyphens with no spaces around them: split on `-`, every piece is exactly one
    sentence, with no space at either end."""

    instruction_id = "detectable_format:sentence_hyphens"

    def build_description(self) -> str:
        return "Connect all of your sentences with hyphens, without any spaces around the hyphens."

    def check_following(self, text: str) -> bool:
        pieces = text.strip().split("-")
        return all(piece == piece.strip() and len(split_sentences(piece)) == 1 for piece in pieces)


@register
class SquareBrackets(Instruction):
    """Every word is in its own square brackets: each whitespace-separated piece starts with `[` and ends with
    `]` (punctuation inside the brackets is allowed). At least one word."""

    instruction_id = "detectable_format:square_brackets"

    def build_description(self) -> str:
        return "Put every word of your response in square brackets, like [this] [one]."

    def check_following(self, text: str) -> bool:
        pieces = text.split()
        return bool(pieces) and all(len(piece) >= 2 and piece[0] == "[" and piece[-1] == "]" for piece in pieces)


@register
class BigramWrapping(Instruction):
    """Every pair of consecutive words is wrapped in double angular brackets: `<<I am>> <<at home>>`. The text is
    made of `<<...>>` groups of exactly two words (the last group may hold one word when the count is odd);
    outside the groups only punctuation and spaces are allowed."""

    instruction_id = "detectable_format:bigram_wrapping"

    _GROUP = re.compile(r"<<([^<>]*)>>")

    def build_description(self) -> str:
        return "Wrap every pair of consecutive words in double angular brackets, such as <<I am>> <<at home>>."

    def check_following(self, text: str) -> bool:
        groups = [group.split() for group in self._GROUP.findall(text)]
        if not groups or joined_words(self._GROUP.sub(" ", text)):
            return False
        return all(len(group) == 2 for group in groups[:-1]) and len(groups[-1]) in (1, 2)


# ============================================================================================== keywords


@register
class KeywordOnce(Instruction):
    """The keyword occurs exactly once (case-insensitive, counted anywhere as IFEval counts keywords)."""

    instruction_id = "keywords:word_once"

    def build_description(self, *, keyword: str) -> str:
        self._args = {"keyword": _phrase("keyword", keyword).strip()}
        return f"Include the keyword {self._args['keyword']!r} once in your response."

    def check_following(self, text: str) -> bool:
        return count_occurrences(text, self._args["keyword"]) == 1


@register
class KeywordCountDifferentNumbers(KeywordFrequency):
    """The same rule as `keywords:frequency`, under the id the training set uses."""

    instruction_id = "keywords:word_count_different_numbers"


@register
class CountIncrementWord(Instruction):
    """`keyword1` occurs exactly once and `keyword2` exactly twice (case-insensitive, counted anywhere)."""

    instruction_id = "count:count_increment_word"

    def build_description(self, *, keyword1: str, keyword2: str) -> str:
        self._args = {
            "keyword1": _phrase("keyword1", keyword1).strip(),
            "keyword2": _phrase("keyword2", keyword2).strip(),
        }
        return f"Include the keyword {self._args['keyword1']!r} once and the keyword {self._args['keyword2']!r} twice."

    def check_following(self, text: str) -> bool:
        return (
            count_occurrences(text, self._args["keyword1"]) == 1
            and count_occurrences(text, self._args["keyword2"]) == 2
        )


@register
class ExcludeWordHarder(Instruction):
    """The keyword does not occur as a whole word (case-insensitive; next to punctuation, at the start or at the
    end counts too). `instruction`, which the generator used to pick the keyword, is accepted and ignored."""

    instruction_id = "keywords:exclude_word_harder"

    def build_description(self, *, keyword: str, instruction: Any = None) -> str:
        self._args = {"keyword": _phrase("keyword", keyword).strip()}
        return f"Do not include the keyword {self._args['keyword']!r} in your response."

    def check_following(self, text: str) -> bool:
        return _whole_word_pattern(self._args["keyword"]).search(text) is None


@register
class NoAdjacentConsecutiveLetters(Instruction):
    """No word is followed by a word starting with the next letter of the alphabet (`apple banana` breaks it,
    `banana apple` does not). Letters are compared case-insensitively, after punctuation at the start of a word."""

    instruction_id = "keywords:no_adjacent_consecutive"

    def build_description(self) -> str:
        return "No two adjacent words may start with consecutive letters of the alphabet."

    def check_following(self, text: str) -> bool:
        initials = [word[0].lower() for word in edge_words(text)]
        return not any(
            first.isalpha() and second.isalpha() and ord(second) - ord(first) == 1
            for first, second in zip(initials, initials[1:])
        )


@register
class Palindrome(Instruction):
    """Some word (letters and digits only, case-insensitive) of at least 3 characters reads the same backwards:
    `level`, `Noon`, `racecar`. Single letters such as `a` and `I` do not count."""

    instruction_id = "keywords:palindrome"

    def build_description(self) -> str:
        return "Include a palindrome in your response."

    def check_following(self, text: str) -> bool:
        return any(len(word) >= 3 and word == word[::-1] for word in bare_words(text))


@register
class KeywordSpecificPosition(Instruction):
    """Sentence `n` (1-based) has the keyword as its word `m` (1-based), case-insensitive. Words are the
    sentence's words without punctuation (`don't` is one word)."""

    instruction_id = "keywords:keyword_specific_position"

    def build_description(self, *, keyword: str, n: int, m: int) -> str:
        self._args = {"keyword": single_word("keyword", keyword), "n": _count("n", n, 1), "m": _count("m", m, 1)}
        args = self._args
        return f"Include the keyword {args['keyword']!r} in sentence {args['n']}, as word {args['m']} of that sentence."

    def check_following(self, text: str) -> bool:
        sentences = split_sentences(text)
        if len(sentences) < self._args["n"]:
            return False
        words = joined_words(sentences[self._args["n"] - 1])
        return len(words) >= self._args["m"] and words[self._args["m"] - 1].lower() == self._args["keyword"].lower()


@register
class StartEnd(Instruction):
    """The first and the last word are the same word (case-insensitive), at least two words, and nothing
    (not even punctuation) follows the last word."""

    instruction_id = "keywords:start_end"

    def build_description(self) -> str:
        return "Start and end your response with the same word, and write nothing after that last word."

    def check_following(self, text: str) -> bool:
        body = text.strip()
        words = edge_words(body)
        return len(words) >= 2 and body[-1].isalnum() and words[0].lower() == words[-1].lower()


# ============================================================================================ paragraphs


@register
class TwoDividedParagraphs(Instruction):
    """Exactly 2 paragraphs separated by the markdown divider `***` (the `length_constraints:number_paragraphs`
    rule with 2)."""

    instruction_id = "paragraphs:paragraphs"

    def build_description(self) -> str:
        return "Write exactly 2 paragraphs, separated by the markdown divider ***."

    def check_following(self, text: str) -> bool:
        paragraphs = divider_paragraphs(text)
        return paragraphs is not None and len(paragraphs) == 2


@register
class TwoBlankLineParagraphs(Instruction):
    """Exactly 2 paragraphs separated by a blank line (one or more; lines of spaces count as blank)."""

    instruction_id = "paragraphs:paragraphs2"

    def build_description(self) -> str:
        return "Write exactly 2 paragraphs, separated from each other by a blank line."

    def check_following(self, text: str) -> bool:
        return len(split_on_blank_lines(text)) == 2


# ========================================================================================= first/last word


class EdgeWord(Instruction):
    """Base of the first/last word instructions: `pick` chooses the word of a text, and `PER_SENTENCE` applies
    the rule to every sentence (at least one) instead of the whole answer. Words are compared
    case-insensitively, without the punctuation at their ends."""

    PER_SENTENCE = False
    DESCRIPTION = ""

    def _store(self, name: str, value: Any) -> str:
        self._args = {name: single_word(name, value)}
        self._word = self._args[name]
        return self.DESCRIPTION.format(word=self._word)

    @staticmethod
    def pick(words: list[str]) -> str:
        raise NotImplementedError

    def check_following(self, text: str) -> bool:
        pieces = split_sentences(text) if self.PER_SENTENCE else [text]
        for piece in pieces:
            words = edge_words(piece)
            if not words or self.pick(words).lower() != self._word.lower():
                return False
        return bool(pieces)


class FirstWord(EdgeWord):
    def build_description(self, *, first_word: str) -> str:
        return self._store("first_word", first_word)

    @staticmethod
    def pick(words: list[str]) -> str:
        return words[0]


class LastWord(EdgeWord):
    def build_description(self, *, last_word: str) -> str:
        return self._store("last_word", last_word)

    @staticmethod
    def pick(words: list[str]) -> str:
        return words[-1]


@register
class FirstWordOfSentences(FirstWord):
    """Every sentence (at least one) starts with `first_word`."""

    instruction_id = "first_word:first_word_sent"
    PER_SENTENCE = True
    DESCRIPTION = "The first word of each sentence should be the word {word}."


@register
class FirstWordOfAnswer(FirstWord):
    """The answer starts with `first_word` (after leading punctuation and markdown)."""

    instruction_id = "first_word:first_word_answer"
    DESCRIPTION = "The first word of your response should be the word {word}."


@register
class LastWordOfSentences(LastWord):
    """Every sentence (at least one) ends with `last_word` before its punctuation."""

    instruction_id = "last_word:last_word_sent"
    PER_SENTENCE = True
    DESCRIPTION = "The last word of each sentence, before punctuation, should be the word {word}."


@register
class LastWordOfAnswer(LastWord):
    """The answer ends with `last_word` (punctuation after it ignored)."""

    instruction_id = "last_word:last_word_answer"
    DESCRIPTION = "The last word of your response should be the word {word}."


# ============================================================================================ punctuation


@register
class NoDot(ForbiddenCharacters):
    """No period anywhere (`.` and the fullwidth `．`), as punctuation or otherwise (`3.5`, `e.g.`)."""

    instruction_id = "punctuation:punctuation_dot"
    FORBIDDEN = frozenset(".．")
    DESCRIPTION = "In your entire response, do not use any . (dots), as punctuation or otherwise."


@register
class NoExclamation(ForbiddenCharacters):
    """No exclamation mark anywhere (`!` and the fullwidth `！`)."""

    instruction_id = "punctuation:punctuation_exclamation"
    FORBIDDEN = frozenset("!！")
    DESCRIPTION = "In your entire response, do not use any ! (exclamation marks)."


# ================================================================================================ counting


@register
class LowercaseWordCount(NArgument):
    """At most N words written all in lowercase letters (`word`, `café`; a word with a capital or a digit is not
    one). Words are runs of letters, digits and underscores, as in the word count."""

    instruction_id = "count:lowercase_counting"
    DESCRIPTION = "Your response may contain at most {n} words written entirely in lowercase letters."

    def check_following(self, text: str) -> bool:
        lowercase = [word for word in re.findall(r"\w+", text) if word.isalpha() and word.islower()]
        return len(lowercase) <= self.n


@register
class LetterCount(Instruction):
    """The number of letters (any alphabet; digits, spaces and punctuation are not letters) compared with N."""

    instruction_id = "letters:letter_counting"

    def build_description(self, *, N: int, relation: str) -> str:
        self._args = {"N": _count("N", N), "relation": _relation("relation", relation)}
        return f"Answer with {_relation_words(relation)} {self._args['N']} letters."

    def check_following(self, text: str) -> bool:
        return _compare(sum(1 for char in text if char.isalpha()), self._args["relation"], self._args["N"])


@register
class LetterFrequencyTwo(LetterFrequency):
    """The same rule as `keywords:letter_frequency`, under the id the training set uses."""

    instruction_id = "letters:letter_counting2"


@register
class CountingComposition(Instruction):
    """Exactly 3 paragraphs divided by a markdown divider (`***` or `* * *`), each of exactly `n_sent` sentences,
    each sentence of exactly `n_words` words (punctuation is not a word; `don't` is one word)."""

    instruction_id = "count:counting_composition"

    def build_description(self, *, n_sent: int, n_words: int) -> str:
        self._args = {"n_sent": _count("n_sent", n_sent, 1), "n_words": _count("n_words", n_words, 1)}
        return (
            "Write 3 paragraphs, separated by the markdown divider * * *, each with exactly "
            f"{self._args['n_sent']} sentences of exactly {self._args['n_words']} words."
        )

    def check_following(self, text: str) -> bool:
        paragraphs = divider_paragraphs(text, ("***", "* * *"))
        if paragraphs is None or len(paragraphs) != 3:
            return False
        for paragraph in paragraphs:
            sentences = split_sentences(paragraph)
            if len(sentences) != self._args["n_sent"]:
                return False
            if any(len(joined_words(sentence)) != self._args["n_words"] for sentence in sentences):
                return False
        return True


@register
class CountUnique(Instruction):
    """No word is used twice (case-insensitive; punctuation is not a word; `don't` is one word). At least one
    word."""

    instruction_id = "count:count_unique"

    def build_description(self) -> str:
        return "Use only unique words in your response: no word may be repeated."

    def check_following(self, text: str) -> bool:
        words = [word.lower() for word in joined_words(text)]
        return bool(words) and len(words) == len(set(words))
