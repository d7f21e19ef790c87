"""The IFBench families: the out-of-distribution instruction kinds of AllenAI's IFBench benchmark (word-count
ranges, stop-word ratios, nested brackets, CSV output, copying spans, ...), under IFBench's ids and kwargs names.

Every rule is written from what the instruction tells the model; README.md lists where the reference scorer reads
an instruction differently and which reading is used here. Rules of the form "every word/sentence/line ..." need
at least one word/sentence/line: an empty answer follows none of them. `words:start_verb` needs a part-of-speech
tagger and is not graded (see `NOT_SUPPORTED` in instructions.py).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Any, Optional

from resources_servers.instruction_following.ifeval_train import (
    KeywordSpecificPosition,
    NArgument,
    PromptSpan,
    SmallNArgument,
    same_text,
    single_word,
)
from resources_servers.instruction_following.instructions import (
    Instruction,
    InstructionArgumentError,
    _count,
    _phrase,
    count_whole_words,
    register,
)
from resources_servers.instruction_following.text_utils import (
    bare_words,
    count_syllables,
    count_words,
    edge_words,
    has_japanese,
    is_emoji,
    joined_words,
    split_sentences,
    strip_emoji_modifiers,
    trim_punctuation,
    without_punctuation,
    words,
)


class NoArguments(Instruction):
    """Base of the instructions that take no kwargs: `DESCRIPTION` is what the model is told."""

    DESCRIPTION = ""

    def build_description(self) -> str:
        return self.DESCRIPTION


def _percentage(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise InstructionArgumentError(f"{name} must be a number from 0 to 100, got {value!r}")
    return value


def _final_mark(sentence: str) -> str:
    """The punctuation mark a sentence ends with, looking past closing quotes, brackets and emphasis."""
    body = sentence.rstrip("\"'”’)]»*_ \t\n")
    return body[-1] if body else ""


def _ascii_fold(text: str) -> str:
    """`São Tomé` -> `Sao Tome`: accents removed, other non-ASCII characters dropped."""
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def _is_prime(number: int) -> bool:
    return number >= 2 and all(number % divisor for divisor in range(2, int(number**0.5) + 1))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _nonblank_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


class Nesting:
    """A stack of open groups (brackets or quotes) that knows, when a group closes, how many levels deep it went:
    `close()` is true when the closed group held `levels` nested levels counting itself."""

    def __init__(self, levels: int):
        self.levels = levels
        self.reset()

    def reset(self) -> None:
        self._stack: list[list[Any]] = []  # [opening mark, levels inside it counting itself]

    def top(self) -> Optional[str]:
        return self._stack[-1][0] if self._stack else None

    def open(self, mark: str) -> None:
        self._stack.append([mark, 1])

    def close(self) -> bool:
        _, depth = self._stack.pop()
        if self._stack:
            self._stack[-1][1] = max(self._stack[-1][1], depth + 1)
        return depth >= self.levels


# =================================================================================================== count


@register
class WordCountRange(Instruction):
    """The word count (runs of letters/digits/underscores, as `length_constraints:number_words`) is between
    `min_words` and `max_words`, both included."""

    instruction_id = "count:word_count_range"

    def build_description(self, *, min_words: int, max_words: int) -> str:
        low, high = _count("min_words", min_words), _count("max_words", max_words)
        if high < low:
            raise InstructionArgumentError(f"max_words ({high}) is smaller than min_words ({low})")
        self._args = {"min_words": low, "max_words": high}
        return f"The response must contain between {low} and {high} words."

    def check_following(self, text: str) -> bool:
        return self._args["min_words"] <= count_words(text) <= self._args["max_words"]


@register
class UniqueWordCount(NArgument):
    """At least N different words (case-insensitive, punctuation at word ends ignored)."""

    instruction_id = "count:unique_word_count"
    DESCRIPTION = "Use at least {n} unique words in the response."

    def check_following(self, text: str) -> bool:
        return len({word.lower() for word in edge_words(text)}) >= self.n


# English stop words (the standard NLTK list, as IFBench counts them), without the forms with an apostrophe: words
# are counted as runs of letters/digits, so "don't" is the two stop words "don" and "t".
STOP_WORDS = frozenset(
    """i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers
    herself it its itself they them their theirs themselves what which who whom this that these those am is are
    was were be been being have has had having do does did doing a an the and but if or because as until while of
    at by for with about against between into through during before after above below to from up down in out on
    off over under again further then once here there when where why how all any both each few more most other
    some such no nor not only own same so than too very s t can will just don should now d ll m o re ve y ain
    aren couldn didn doesn hadn hasn haven isn ma mightn mustn needn shan shouldn wasn weren won wouldn""".split()
)


@register
class StopWordPercentage(Instruction):
    """Stop words are at most `percentage` % of the words (words as in the word count; a stop word is one of the
    standard English list, case-insensitive). An answer without words fails."""

    instruction_id = "ratio:stop_words"

    def build_description(self, *, percentage: float) -> str:
        self._args = {"percentage": _percentage("percentage", percentage)}
        return f"Stop words must make up no more than {self._args['percentage']}% of the words of your response."

    def check_following(self, text: str) -> bool:
        tokens = words(text)
        stop = sum(1 for token in tokens if token.lower() in STOP_WORDS)
        return bool(tokens) and stop * 100 <= self._args["percentage"] * len(tokens)


@register
class ConjunctionCount(SmallNArgument):
    """At least `small_n` different coordinating conjunctions (for, and, nor, but, or, yet, so), case-insensitive."""

    instruction_id = "count:conjunctions"

    CONJUNCTIONS = frozenset(["for", "and", "nor", "but", "or", "yet", "so"])

    DESCRIPTION = "Use at least {n} different coordinating conjunctions in the response."

    def check_following(self, text: str) -> bool:
        return len(self.CONJUNCTIONS.intersection(bare_words(text))) >= self.n


@register
class PersonNameCount(NArgument):
    """At least N different names of IFBench's 50-name list (`NAMES`: Emma, Liam, Sophia, ...), each as a whole word
    with its capital letter."""

    instruction_id = "count:person_names"

    NAMES = (
        "Emma Liam Sophia Jackson Olivia Noah Ava Lucas Isabella Mason Mia Ethan Charlotte Alexander Amelia "
        "Benjamin Harper Leo Zoe Daniel Chloe Samuel Lily Matthew Grace Owen Abigail Gabriel Ella Jacob Scarlett "
        "Nathan Victoria Elijah Layla Nicholas Audrey David Hannah Christopher Penelope Thomas Nora Andrew Aria "
        "Joseph Claire Ryan Stella Jonathan"
    ).split()

    DESCRIPTION = (
        "Mention at least {n} different person names in the response, from this list: " + ", ".join(NAMES) + "."
    )

    def check_following(self, text: str) -> bool:
        found = set(re.findall(r"\w+", text)).intersection(self.NAMES)
        return len(found) >= self.n


@register
class NumbersCount(NArgument):
    """Exactly N numbers. A number is a run of digits, with `,` or `.` between digit groups (`1,000`, `3.14` are
    one number each)."""

    instruction_id = "count:numbers"
    DESCRIPTION = "Include exactly {n} numbers in the response."

    def check_following(self, text: str) -> bool:
        return len(re.findall(r"\d+(?:[.,]\d+)*", text)) == self.n


@register
class PunctuationCover(NoArguments):
    """Uses `.`, `,`, `!`, `?`, `;`, `:` each at least once, and an interrobang (`?!`, `!?` or `‽`); the marks of
    one interrobang do not count for `?` and `!`."""

    instruction_id = "count:punctuation"
    DESCRIPTION = (
        "Use every standard punctuation mark at least once, including semicolons, colons, and the "
        "interrobang (?!)."
    )

    def check_following(self, text: str) -> bool:
        interrobang = re.search(r"\?!|!\?|‽", text)
        if interrobang is None:
            return False
        rest = text[: interrobang.start()] + text[interrobang.end() :]
        return all(mark in rest for mark in ".,!?;:")


@register
class JapaneseEveryNthWord(NArgument):
    """Every Nth whitespace-separated word (the Nth, 2Nth, ...) is Japanese: it has a hiragana, katakana or kanji
    character. Words that are only punctuation or only digits are not checked."""

    instruction_id = "count:words_japanese"
    MINIMUM = 1
    DESCRIPTION = "Every word at a position that is a multiple of {n} must be in Japanese."

    def check_following(self, text: str) -> bool:
        pieces = text.split()
        for position in range(self.n, len(pieces) + 1, self.n):
            word = trim_punctuation(pieces[position - 1])
            if word and not word.isdigit() and not has_japanese(word):
                return False
        return bool(pieces)


@register
class PronounCount(NArgument):
    """At least N pronouns (personal, possessive, reflexive, demonstrative, interrogative, relative and indefinite;
    `PRONOUNS`), counted case-insensitively over runs of letters (`she/her` is two, `it's` holds `it`)."""

    instruction_id = "count:pronouns"

    PRONOUNS = frozenset(
        """i me we us you he him she her it they them my mine our ours your yours his hers its their theirs myself
        ourselves yourself yourselves himself herself itself themselves this that these those who whom whose which
        what whoever whomever whatever whichever anybody anyone anything everybody everyone everything nobody
        nothing somebody someone something each either neither both all some any none""".split()
    )

    DESCRIPTION = "The response should include at least {n} pronouns."

    def check_following(self, text: str) -> bool:
        letters = re.findall(r"[^\W\d_]+", text.lower())
        return sum(1 for word in letters if word in self.PRONOUNS) >= self.n


@register
class KeywordsMultiple(Instruction):
    """`keyword1` .. `keyword5` occur exactly 1, 2, 3, 5 and 7 times, as whole words, case-insensitive."""

    instruction_id = "count:keywords_multiple"

    TIMES = (1, 2, 3, 5, 7)

    def build_description(self, *, keyword1: str, keyword2: str, keyword3: str, keyword4: str, keyword5: str) -> str:
        given = (keyword1, keyword2, keyword3, keyword4, keyword5)
        self._args = {
            f"keyword{index}": _phrase(f"keyword{index}", word).strip() for index, word in enumerate(given, 1)
        }
        parts = [f"{word!r} {times} time(s)" for word, times in zip(self._args.values(), self.TIMES)]
        return "Include these keywords exactly this often: " + ", ".join(parts) + "."

    def check_following(self, text: str) -> bool:
        return all(count_whole_words(text, word) == times for word, times in zip(self._args.values(), self.TIMES))


# =================================================================================================== ratio


@register
class SentenceTypeRatio(NoArguments):
    """Twice as many declarative sentences (ending in `.`) as interrogative ones (ending in `?`), with at least
    one question (0:0 is no ratio)."""

    instruction_id = "ratio:sentence_type"
    DESCRIPTION = "Maintain a 2:1 ratio of declarative to interrogative sentences."

    def check_following(self, text: str) -> bool:
        marks = Counter(_final_mark(sentence) for sentence in split_sentences(text))
        return marks["?"] >= 1 and marks["."] == 2 * marks["?"]


@register
class SentenceBalance(NoArguments):
    """As many declarative (`.`) as interrogative (`?`) as exclamatory (`!`) sentences, at least one of each."""

    instruction_id = "ratio:sentence_balance"
    DESCRIPTION = "Use the same number of declarative, interrogative and exclamatory sentences."

    def check_following(self, text: str) -> bool:
        marks = Counter(_final_mark(sentence) for sentence in split_sentences(text))
        return marks["."] >= 1 and marks["."] == marks["?"] == marks["!"]


@register
class TrigramOverlap(Instruction):
    """The share of the answer's distinct word trigrams that also occur in `reference_text` is within 2
    percentage points of `percentage`. Words are compared case-insensitively, punctuation ignored."""

    instruction_id = "ratio:overlap"

    def build_description(self, *, reference_text: str, percentage: float) -> str:
        self._args = {
            "reference_text": _phrase("reference_text", reference_text),
            "percentage": _percentage("percentage", percentage),
        }
        return f"Keep a trigram overlap of {self._args['percentage']}% (±2%) with the reference text."

    @staticmethod
    def trigrams(text: str) -> set[tuple[str, ...]]:
        tokens = [word.lower() for word in joined_words(text)]
        return {tuple(tokens[index : index + 3]) for index in range(len(tokens) - 2)}

    def check_following(self, text: str) -> bool:
        answer = self.trigrams(text)
        if not answer:
            return False
        shared = len(answer & self.trigrams(self._args["reference_text"])) * 100 / len(answer)
        return abs(shared - self._args["percentage"]) <= 2


@register
class SentencesSameLengthDifferentWords(NoArguments):
    """Exactly 3 sentences with the same number of characters each, and no word used twice across them
    (case-insensitive, punctuation ignored)."""

    instruction_id = "ratio:sentence_words"
    DESCRIPTION = (
        "Respond with three sentences that all have the same number of characters but use all different "
        "words."
    )

    def check_following(self, text: str) -> bool:
        sentences = split_sentences(text)
        if len(sentences) != 3 or len({len(sentence) for sentence in sentences}) != 1:
            return False
        all_words = bare_words(" ".join(sentences))
        return len(all_words) == len(set(all_words))


# =================================================================================================== words


@register
class AlphabetLoop(NoArguments):
    """Each word starts with the letter after the previous word's first letter, from Z back to A; the first word
    starts with any letter (A-Z). Punctuation is ignored."""

    instruction_id = "words:alphabet"
    DESCRIPTION = "Each word must start with the next letter of the alphabet, looping back to 'A' after 'Z'."

    def check_following(self, text: str) -> bool:
        initials = [word[0] for word in bare_words(text)]
        if not initials or not "a" <= initials[0] <= "z":
            return False
        return all(
            "a" <= before <= "z" and after == chr((ord(before) - ord("a") + 1) % 26 + ord("a"))
            for before, after in zip(initials, initials[1:])
        )


@register
class ThreeVowels(NoArguments):
    """One paragraph (no line break) whose words use at most three of the vowels a, e, i, o, u (case-insensitive)."""

    instruction_id = "words:vowel"
    DESCRIPTION = "Write a paragraph using words that contain only three types of vowels."

    def check_following(self, text: str) -> bool:
        body = text.strip()
        return bool(body) and "\n" not in body and len(set("aeiou").intersection(body.lower())) <= 3


@register
class ConsonantClusters(NoArguments):
    """Every word has two consonant letters next to each other (`st`, `ck`; y counts as a consonant)."""

    instruction_id = "words:consonants"
    DESCRIPTION = (
        "Ensure each word in your response has at least one consonant cluster (two or more consonants "
        "together)."
    )

    _CLUSTER = re.compile(r"[bcdfghjklmnpqrstvwxyz]{2}")

    def check_following(self, text: str) -> bool:
        found = edge_words(text.lower())
        return bool(found) and all(self._CLUSTER.search(word) for word in found)


@register
class LongPalindromes(NoArguments):
    """At least 10 words (occurrences, punctuation ignored, case-insensitive) of at least 5 characters that read the
    same backwards."""

    instruction_id = "words:palindrome"
    DESCRIPTION = "Include at least 10 single-word palindromes, each at least 5 characters long."

    def check_following(self, text: str) -> bool:
        return sum(1 for word in bare_words(text) if len(word) >= 5 and word == word[::-1]) >= 10


@register
class PrimeLengths(NoArguments):
    """Every word (punctuation removed) has a prime number of characters: 2, 3, 5, 7, 11, ..."""

    instruction_id = "words:prime_lengths"
    DESCRIPTION = "Use only words with lengths that are prime numbers."

    def check_following(self, text: str) -> bool:
        found = bare_words(text)
        return bool(found) and all(_is_prime(len(word)) for word in found)


@register
class LimitedWordRepeat(SmallNArgument):
    """No word (case-insensitive, punctuation removed) occurs more than `small_n` times."""

    instruction_id = "words:repeats"
    MINIMUM = 1
    DESCRIPTION = "The response should not repeat any word more than {n} times."

    def check_following(self, text: str) -> bool:
        counts = Counter(bare_words(text))
        return all(count <= self.n for count in counts.values())


@register
class AlternatingSyllableParity(NoArguments):
    """Consecutive words alternate between an odd and an even number of syllables. Syllables are estimated by
    rule (`text_utils.count_syllables`), not looked up in a dictionary."""

    instruction_id = "words:odd_even_syllables"
    DESCRIPTION = "Alternate between words with odd and even numbers of syllables."

    def check_following(self, text: str) -> bool:
        parities = [count_syllables(word) % 2 for word in bare_words(text)]
        return bool(parities) and all(before != after for before, after in zip(parities, parities[1:]))


@register
class LastWordFirstNext(NoArguments):
    """The last word of each sentence is the first word of the next one (case-insensitive, punctuation ignored)."""

    instruction_id = "words:last_first"
    DESCRIPTION = "The last word of each sentence must become the first word of the next sentence."

    def check_following(self, text: str) -> bool:
        sentences = [edge_words(sentence) for sentence in split_sentences(text)]
        if not sentences or not all(sentences):
            return False
        return all(before[-1].lower() == after[0].lower() for before, after in zip(sentences, sentences[1:]))


@register
class ParagraphStartsAndEndsAlike(NoArguments):
    """Each paragraph (non-blank line) ends with the word it starts with (case-insensitive, punctuation ignored)."""

    instruction_id = "words:paragraph_last_first"
    DESCRIPTION = "Each paragraph must end with the same word it started with; separate paragraphs with a newline."

    def check_following(self, text: str) -> bool:
        paragraphs = [edge_words(line.lower()) for line in _nonblank_lines(text)]
        paragraphs = [found for found in paragraphs if found]
        return bool(paragraphs) and all(found[0] == found[-1] for found in paragraphs)


@register
class NoConsecutiveFirstLetter(NoArguments):
    """No two consecutive words start with the same character (case-insensitive, punctuation removed)."""

    instruction_id = "words:no_consecutive"
    DESCRIPTION = "No two consecutive words can share the same first letter."

    def check_following(self, text: str) -> bool:
        initials = [word[0] for word in bare_words(text)]
        return bool(initials) and all(before != after for before, after in zip(initials, initials[1:]))


@register
class KeywordSpecificPositionIFBench(KeywordSpecificPosition):
    """The `keywords:keyword_specific_position` rule under IFBench's id."""

    instruction_id = "words:keywords_specific_position"


@register
class WordsPosition(Instruction):
    """The second word and the second-to-last word are both the keyword (case-insensitive, punctuation ignored)."""

    instruction_id = "words:words_position"

    def build_description(self, *, keyword: str) -> str:
        self._args = {"keyword": single_word("keyword", keyword)}
        keyword = self._args["keyword"]
        return f"The second word and the second-to-last word of your response should be the word {keyword}."

    def check_following(self, text: str) -> bool:
        found = [word.lower() for word in joined_words(text)]
        wanted = self._args["keyword"].lower()
        return len(found) >= 2 and found[1] == wanted and found[-2] == wanted


# ================================================================================================ sentence


@register
class IncrementingAlliteration(NoArguments):
    """Each sentence has a longer run of consecutive words starting with the same letter than the sentence before
    (a lone word is a run of 0: no alliteration). Case-insensitive, punctuation ignored."""

    instruction_id = "sentence:alliteration_increment"
    DESCRIPTION = "Each sentence must have a longer sequence of consecutive alliterative words than the previous one."

    @staticmethod
    def longest_run(sentence: str) -> int:
        initials = [word[0] for word in bare_words(sentence)]
        longest, run = 0, 1
        for before, after in zip(initials, initials[1:]):
            run = run + 1 if before == after else 1
            if run > 1:
                longest = max(longest, run)
        return longest

    def check_following(self, text: str) -> bool:
        runs = [self.longest_run(sentence) for sentence in split_sentences(text)]
        return bool(runs) and all(before < after for before, after in zip(runs, runs[1:]))


@register
class KeywordInSentence(Instruction):
    """Sentence N (1-based) contains `word` as a whole word, case-insensitive."""

    instruction_id = "sentence:keyword"

    def build_description(self, *, word: str, N: int) -> str:
        self._args = {"word": _phrase("word", word).strip(), "N": _count("N", N, 1)}
        return f"The response must include the keyword {self._args['word']!r} in sentence number {self._args['N']}."

    def check_following(self, text: str) -> bool:
        sentences = split_sentences(text)
        wanted = self._args["N"]
        return len(sentences) >= wanted and count_whole_words(sentences[wanted - 1], self._args["word"]) > 0


@register
class IncrementingWordCount(SmallNArgument):
    """Each sentence has exactly `small_n` more words (punctuation removed) than the sentence before."""

    instruction_id = "sentence:increment"
    MINIMUM = 1
    DESCRIPTION = "Each sentence must contain exactly {n} more words than the previous one."

    def check_following(self, text: str) -> bool:
        lengths = [len(bare_words(sentence)) for sentence in split_sentences(text)]
        return bool(lengths) and all(after == before + self.n for before, after in zip(lengths, lengths[1:]))


# ================================================================================================== format


@register
class NestedBrackets(NoArguments):
    """Some group of brackets nests at least 5 levels deep and is properly closed: `( [ { ( [ ] ) } ] )`, any mix of
    `()`, `[]` and `{}`. A closing bracket that does not match the open one starts the count again."""

    instruction_id = "format:parentheses"
    DESCRIPTION = "Nest parentheses (and [brackets {and braces}]) at least 5 levels deep."

    PAIRS = {")": "(", "]": "[", "}": "{"}

    def check_following(self, text: str) -> bool:
        nesting = Nesting(5)
        for char in text:
            if char in "([{":
                nesting.open(char)
            elif char in self.PAIRS:
                if nesting.top() != self.PAIRS[char]:
                    nesting.reset()
                elif nesting.close():
                    return True
        return False


@register
class NestedQuotes(NoArguments):
    """A quotation holds a quotation that holds a third one, alternating double `"` and single `'` quotes (either
    first), all closed: `"a 'b "c" b' a"`. A quote mark closes the open quotation of the same kind, otherwise it
    opens one."""

    instruction_id = "format:quotes"
    DESCRIPTION = (
        "Include quotes within quotes within quotes, at least 3 levels deep, alternating between double "
        "quotes and single quotes."
    )

    def check_following(self, text: str) -> bool:
        nesting = Nesting(3)
        for char in text:
            if char not in "\"'":
                continue
            if nesting.top() != char:
                nesting.open(char)
            elif nesting.close():
                return True
        return False


@register
class OptionsResponse(Instruction):
    """The answer is exactly one of the options and nothing else. `options` lists them separated by `/`, ` or `
    or `,` (`yes/no/maybe`, `I know or I don't know`, `a), b), c), d)`). Letter options such as `a)` must match
    exactly; word options are compared case-insensitively, ignoring punctuation and spaces at the ends."""

    instruction_id = "format:options"

    def build_description(self, *, options: str) -> str:
        options = _phrase("options", options).strip()
        if "/" in options:
            choices = options.split("/")
        elif re.search(r"\s+or\s+", options):
            choices = re.split(r"\s+or\s+", options)
        else:
            choices = options.split(",")
        choices = [choice.strip() for choice in choices if choice.strip()]
        if len(choices) < 2:
            raise InstructionArgumentError(f"options must list at least two options, got {options!r}")
        self._args = {"options": options}
        self._choices = choices
        self._letters = all(re.fullmatch(r"\(?[A-Za-z][).]?", choice) for choice in choices)
        return f"Answer with one of the following options: {options}. Do not give any explanation."

    def check_following(self, text: str) -> bool:
        if self._letters:
            return text.strip() in self._choices
        answer = trim_punctuation(text).lower()
        return any(trim_punctuation(choice).lower() == answer for choice in self._choices)


@register
class WordPerLine(NoArguments):
    """Each word on its own line: every line that has a word has exactly one (punctuation removed)."""

    instruction_id = "format:newline"
    DESCRIPTION = "Write each word on a new line."

    def check_following(self, text: str) -> bool:
        counts = [len(bare_words(line)) for line in text.splitlines()]
        counts = [count for count in counts if count]
        return bool(counts) and all(count == 1 for count in counts)


@register
class EmojiAfterSentences(NoArguments):
    """Every sentence ends with an emoji (before or after its final punctuation); an emoji that opens the next
    sentence also counts, since a sentence splitter may put it there."""

    instruction_id = "format:emoji"
    DESCRIPTION = "Please use an emoji at the end of every sentence."

    @staticmethod
    def _emoji_at(piece: str, last: bool) -> bool:
        core = strip_emoji_modifiers(without_punctuation(piece).strip())
        return bool(core) and is_emoji(core[-1] if last else core[0])

    def check_following(self, text: str) -> bool:
        sentences = split_sentences(text)
        ends = []  # where each sentence ends in the text
        position = 0
        for sentence in sentences:
            position = text.index(sentence, position) + len(sentence)
            ends.append(position)
        for index, sentence in enumerate(sentences):
            following = sentences[index + 1] if index + 1 < len(sentences) else ""
            gap_end = text.index(following, ends[index]) if following else len(text)
            if not (
                self._emoji_at(sentence, last=True)
                or self._emoji_at(text[ends[index] : gap_end], last=False)
                or self._emoji_at(following, last=False)
            ):
                return False
        return bool(sentences)


@register
class IndentStairs(NoArguments):
    """Each non-blank line is indented (spaces and tabs) further than the line before."""

    instruction_id = "format:line_indent"
    DESCRIPTION = "Create stairs by incrementally indenting each new line."

    def check_following(self, text: str) -> bool:
        indents = [_indent(line) for line in _nonblank_lines(text)]
        return bool(indents) and all(before < after for before, after in zip(indents, indents[1:]))


@register
class QuoteThenExplanation(NoArguments):
    """Every quoted phrase (`"..."` or `“...”`) is followed by some unquoted text with a letter or digit before the
    next quotation or the end. At least one quoted phrase."""

    instruction_id = "format:quote_unquote"
    DESCRIPTION = "Every quoted phrase must be followed by an unquoted explanation."

    def check_following(self, text: str) -> bool:
        normal = text.replace("“", '"').replace("”", '"')
        pieces = normal.split('"')
        if len(pieces) < 3:
            return False
        # pieces alternate: outside, quoted, outside, quoted, ...; an unclosed quote leaves an even count.
        if len(pieces) % 2 == 0:
            return False
        return all(re.search(r"[^\W_]", pieces[index]) for index in range(2, len(pieces), 2))


@register
class SpecialBulletPoints(Instruction):
    """A list whose items start with `sep` instead of a bullet: at least two lines starting (after indentation) with
    the separator."""

    instruction_id = "format:list"

    def build_description(self, *, sep: str) -> str:
        self._args = {"sep": _phrase("sep", sep).strip()}
        return f"Answer with a list of items; instead of bullet points use {self._args['sep']}."

    def check_following(self, text: str) -> bool:
        return sum(1 for line in text.splitlines() if line.strip().startswith(self._args["sep"])) >= 2


@register
class ItalicThesis(NoArguments):
    """A thesis in HTML italics (`<i>...</i>` or `<em>...</em>`, some text inside) followed by more text."""

    instruction_id = "format:thesis"
    DESCRIPTION = "Each section must begin with a thesis statement in italics; use HTML to indicate the italics."

    _ITALIC = re.compile(r"<(i|em)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)

    def check_following(self, text: str) -> bool:
        return any(match.group(2).strip() and text[match.end() :].strip() for match in self._ITALIC.finditer(text))


def _bullet_kind(line: str) -> Optional[str]:
    """`*` or `-` when the line is a markdown bullet of that kind (marker, a space, some text), else None."""
    match = re.match(r"\s*([*\-])\s+\S", line)
    return match.group(1) if match else None


@register
class SubBulletPoints(NoArguments):
    """Bullet points with `*`, each followed by at least one sub-bullet with `-` before the next `*` bullet (or the
    end). At least one `*` bullet, and no `-` sub-bullet before the first one."""

    instruction_id = "format:sub-bullets"
    DESCRIPTION = "Use bullet points with * and give each bullet point at least one sub-bullet point with -."

    def check_following(self, text: str) -> bool:
        kinds = [kind for kind in map(_bullet_kind, text.splitlines()) if kind]
        if not kinds or kinds[0] != "*" or kinds[-1] != "-":
            return False
        return "**" not in "".join(kinds)


@register
class SentencesThenBullets(NoArguments):
    """First text with at least two sentences ending in a period, then at least two `*` bullet points, and nothing
    after the bullets (blank lines aside)."""

    instruction_id = "format:no_bullets_bullets"
    DESCRIPTION = (
        "Your answer must contain at least two sentences ending in a period followed by at least two "
        "bullet points denoted by *."
    )

    def check_following(self, text: str) -> bool:
        lines = _nonblank_lines(text)
        first_bullet = next((index for index, line in enumerate(lines) if line.strip().startswith("*")), len(lines))
        bullets = lines[first_bullet:]
        if len(bullets) < 2 or not all(line.strip().startswith("*") for line in bullets):
            return False
        prose = split_sentences("\n".join(lines[:first_bullet]))
        return sum(1 for sentence in prose if _final_mark(sentence) == ".") >= 2


@register
class TitleCase(NoArguments):
    """Every word starts with a capital letter, except the minor words (articles, short prepositions and
    conjunctions such as `a`, `of`, `and`), which may be lowercase when they are not the first word. Words
    starting with a digit or symbol are not checked."""

    instruction_id = "format:title_case"
    DESCRIPTION = "Write the entire response in title case (capitalize the first letter of every major word)."

    MINOR = frozenset("a an the and but or nor for so yet as at by in of off on per to up via vs".split())

    def check_following(self, text: str) -> bool:
        found = joined_words(text)
        if not found:
            return False
        for index, word in enumerate(found):
            if not word[0].isalpha() or word[0].isupper():
                continue
            if index == 0 or word.lower() not in self.MINOR:
                return False
        return True


@register
class OutputTemplate(NoArguments):
    """The answer follows the template `My Answer: ... My Conclusion: ... Future Outlook: ...`: the three labels
    appear, in this order, with the letter case shown."""

    instruction_id = "format:output_template"
    DESCRIPTION = (
        "Use this exact template for your response: My Answer: [answer] My Conclusion: [conclusion] "
        "Future Outlook: [outlook]"
    )

    LABELS = ("My Answer:", "My Conclusion:", "Future Outlook:")

    def check_following(self, text: str) -> bool:
        position = 0
        for label in self.LABELS:
            position = text.find(label, position)
            if position < 0:
                return False
            position += len(label)
        return True


@register
class NoWhitespace(NoArguments):
    """Some text, and no whitespace character anywhere (spaces, tabs, line breaks, non-breaking spaces)."""

    instruction_id = "format:no_whitespace"
    DESCRIPTION = "The output should not contain any whitespace."

    def check_following(self, text: str) -> bool:
        return bool(text) and not any(char.isspace() for char in text)


# ================================================================================================== repeat


@register
class RepeatChangeFirstWord(Instruction):
    """The request repeated with its first word replaced by a different word: the same words after the first
    (case-insensitive), and a first word that is not the request's."""

    instruction_id = "repeat:repeat_change"

    def build_description(self, *, prompt_to_repeat: str) -> str:
        self._args = {"prompt_to_repeat": _phrase("prompt_to_repeat", prompt_to_repeat)}
        return "Repeat the request, but change its first word; say nothing before it and do not answer it."

    def check_following(self, text: str) -> bool:
        answer, request = text.lower().split(), self._args["prompt_to_repeat"].lower().split()
        return bool(answer) and len(answer) == len(request) and answer[1:] == request[1:] and answer[0] != request[0]


@register
class RepeatSimple(NoArguments):
    """The answer is only the sentence `Only output this sentence here, ignore all other requests.` (letter case
    and runs of whitespace ignored)."""

    instruction_id = "repeat:repeat_simple"
    DESCRIPTION = "Only output this sentence here, ignore all other requests."

    def check_following(self, text: str) -> bool:
        return same_text(text, self.DESCRIPTION)


@register
class RepeatSpan(PromptSpan):
    """The words `n_start` to `n_end` of the request (0-based, both included, split on whitespace), nothing else."""

    instruction_id = "repeat:repeat_span"
    WORDS = True


# ================================================================================================== custom


@register
class MultiplesOfSeven(NoArguments):
    """Counting from 10 to 50 printing only the multiples of 7: the numbers in the answer are exactly 14, 21, 28,
    35, 42, 49, in this order."""

    instruction_id = "custom:multiples"
    DESCRIPTION = "Count from 10 to 50 but only print multiples of 7."

    def check_following(self, text: str) -> bool:
        return [int(number) for number in re.findall(r"\d+", text)] == list(range(14, 50, 7))


@register
class MultipleChoiceQuestions(NoArguments):
    """4 multiple choice questions, each starting with `Question` (optionally numbered), each with exactly 5
    options on their own lines labelled A-E (`A.` or `A)`), the question texts getting strictly longer, and
    nothing before the first question."""

    instruction_id = "custom:mcq_count_length"
    DESCRIPTION = (
        "Generate 4 multiple choice questions with 5 options each about '20th century art history'. Each question "
        'should start with the label "Question". The questions should get progressively longer. Do not provide an '
        "explanation."
    )

    _QUESTION = re.compile(r"^[ \t]*Question(?:[ \t]*\d+)?[ \t]*[.:)]?", re.MULTILINE)
    _OPTION = re.compile(r"[A-Ea-e][.)]\s*\w")

    def check_following(self, text: str) -> bool:
        body = text.strip()
        starts = [match for match in self._QUESTION.finditer(body)]
        if len(starts) != 4 or starts[0].start() != 0:
            return False
        lengths = []
        for index, match in enumerate(starts):
            block = body[match.end() : starts[index + 1].start() if index + 1 < 4 else len(body)]
            question, options = [], 0
            for line in block.splitlines():
                if self._OPTION.match(line.strip()):
                    options += 1
                elif not options:
                    question.append(line.strip())
            if options != 5:
                return False
            lengths.append(len(" ".join(part for part in question if part)))
        return all(before < after for before, after in zip(lengths, lengths[1:]))


@register
class AfricaReverseList(NoArguments):
    """The countries of Africa in reverse alphabetical order, one per line: from the first line naming Zimbabwe,
    at least 52 non-empty lines, sorted Z to A (accents ignored)."""

    instruction_id = "custom:reverse_newline"
    DESCRIPTION = "List the countries of Africa in reverse alphabetical order, each on a new line."

    def check_following(self, text: str) -> bool:
        lines = [_ascii_fold(trim_punctuation(line)) for line in text.splitlines()]
        lines = [line for line in lines if line]
        start = next((index for index, line in enumerate(lines) if "Zimbabwe" in line), None)
        if start is None or len(lines) - start < 52:
            return False
        listed = lines[start:]
        return listed == sorted(listed, reverse=True)


@register
class WordReverseOrder(NoArguments):
    """The answer to "What animal is the national symbol of the US?" written with its words in reverse order:
    read backwards word by word (punctuation ignored), it says "bald eagle"."""

    instruction_id = "custom:word_reverse"
    DESCRIPTION = (
        "What animal is the national symbol of the US? Respond to this query, but make your sentence in reverse "
        "order of what it should be, per word."
    )

    def check_following(self, text: str) -> bool:
        return "bald eagle" in " ".join(reversed(bare_words(text)))


@register
class CharacterReverseOrder(NoArguments):
    """The same answer written backwards letter by letter: it contains "elgae dlab" (case-insensitive)."""

    instruction_id = "custom:character_reverse"
    DESCRIPTION = (
        "What animal is the national symbol of the US? Respond to this query, but make your sentence in reverse "
        "order of what it should be, per letter."
    )

    def check_following(self, text: str) -> bool:
        return "elgae dlab" in " ".join(text.lower().split())


@register
class SentenceAlphabet(NoArguments):
    """A 26-sentence story whose sentences start (after punctuation and spaces) with A, B, C, ... Z in order."""

    instruction_id = "custom:sentence_alphabet"
    DESCRIPTION = (
        "Tell me a 26-sentence story where each sentence's first word starts with the letters of the "
        "alphabet in order."
    )

    def check_following(self, text: str) -> bool:
        sentences = split_sentences(text)
        if len(sentences) != 26:
            return False
        return all(
            trim_punctuation(sentence)[:1].lower() == chr(ord("a") + index) for index, sentence in enumerate(sentences)
        )


@register
class EuropeanCapitalsSort(NoArguments):
    """The capitals of the European countries north of latitude 45°, comma-separated, from north to south, and
    nothing else: exactly the 27 names of `CAPITALS`, Reykjavik to Zagreb, in this order (accents ignored)."""

    instruction_id = "custom:european_capitals_sort"
    DESCRIPTION = (
        "Give me the names of all capital cities of european countries whose latitude is higher than 45 degrees. "
        "List the capital cities without country names, separated by commas, sorted by latitude, from highest to "
        "lowest."
    )

    CAPITALS = (
        "Reykjavik Helsinki Oslo Tallinn Stockholm Riga Moscow Copenhagen Vilnius Minsk Dublin Berlin Amsterdam "
        "Warsaw London Brussels Prague Luxembourg Paris Vienna Bratislava Budapest Vaduz Chisinau Bern Ljubljana "
        "Zagreb"
    ).split()

    def check_following(self, text: str) -> bool:
        names = [name.strip() for name in _ascii_fold(text).split(",") if name.strip()]
        return names == list(self.CAPITALS)


def _csv_fields(line: str, delimiter: str) -> list[tuple[str, bool]]:
    """The fields of one CSV line as (value, was quoted); `""` inside a quoted field is a quote."""
    fields: list[tuple[str, bool]] = []
    index, size = 0, len(line)
    while True:
        while index < size and line[index] in " \t" and line[index] != delimiter:
            index += 1
        if index < size and line[index] == '"':
            value, index = [], index + 1
            while index < size:
                if line[index] == '"':
                    if index + 1 < size and line[index + 1] == '"':
                        value.append('"')
                        index += 2
                        continue
                    index += 1
                    break
                value.append(line[index])
                index += 1
            while index < size and line[index] != delimiter:
                value.append(line[index])
                index += 1
            fields.append(("".join(value).strip(), True))
        else:
            end = line.find(delimiter, index)
            end = size if end < 0 else end
            fields.append((line[index:end].strip(), False))
            index = end
        if index >= size:
            return fields
        index += 1  # the delimiter


class CsvTable(NoArguments):
    """Base of the CSV instructions: the non-blank lines form a table with `HEADER` as its first row and `ROWS`
    data rows, every row with as many fields as the header, split on `DELIMITER`; `rows_ok` adds the rule of
    each instruction."""

    HEADER: tuple[str, ...] = ()
    ROWS = 0
    DELIMITER = ","

    def rows_ok(self, rows: list[list[tuple[str, bool]]]) -> bool:
        return True

    def check_following(self, text: str) -> bool:
        rows = [_csv_fields(line, self.DELIMITER) for line in _nonblank_lines(text.strip().strip("`"))]
        if rows and rows[0] and rows[0][0][0].lower() == "csv" and len(rows[0]) == 1:
            rows = rows[1:]  # a ```csv fence label
        if len(rows) != self.ROWS + 1 or [value for value, _ in rows[0]] != list(self.HEADER):
            return False
        return all(len(row) == len(self.HEADER) for row in rows) and self.rows_ok(rows)


@register
class CityCsv(CsvTable):
    """CSV with the columns ID, Country, City, Year, Count and 7 data rows, comma-delimited."""

    instruction_id = "custom:csv_city"
    DESCRIPTION = (
        'Generate CSV data: The column names are ["ID", "Country", "City", "Year", "Count"], the data should be '
        "comma delimited. Please generate 7 rows."
    )
    HEADER = ("ID", "Country", "City", "Year", "Count")
    ROWS = 7


@register
class SpecialCharacterCsv(CsvTable):
    """CSV with the columns ProductID, Category, Brand, Price, Stock and 14 data rows, comma-delimited, where some
    data field is in double quotes and holds a special character (not a letter, digit, space or underscore)."""

    instruction_id = "custom:csv_special_character"
    DESCRIPTION = (
        'Generate CSV data: The column names are ["ProductID", "Category", "Brand", "Price", "Stock"], the data '
        "should be comma delimited. Please generate 14 rows. Add one field which contains a special character and "
        "enclose it in double quotes."
    )
    HEADER = ("ProductID", "Category", "Brand", "Price", "Stock")
    ROWS = 14

    def rows_ok(self, rows: list[list[tuple[str, bool]]]) -> bool:
        return any(quoted and re.search(r"[^\w\s]", value) for row in rows[1:] for value, quoted in row)


@register
class QuotedTsv(CsvTable):
    """Tab-delimited data with the columns StudentID, Subject, Grade, Semester, Score and 3 data rows, every field
    (the header's too) in double quotes."""

    instruction_id = "custom:csv_quotes"
    DESCRIPTION = (
        'Generate CSV data: The column names are ["StudentID", "Subject", "Grade", "Semester", "Score"], the data '
        "should be tab delimited. Please generate 3 rows and enclose each single field in double quotes."
    )
    HEADER = ("StudentID", "Subject", "Grade", "Semester", "Score")
    ROWS = 3
    DELIMITER = "\t"

    def rows_ok(self, rows: list[list[tuple[str, bool]]]) -> bool:
        return all(quoted for row in rows for _, quoted in row)


@register
class NapoleonDates(NoArguments):
    """Only dates, comma-separated, each `YYYY-MM-DD`, a real calendar day (February up to 29) in the years 1769 to
    1821 (Napoleon's lifetime). No explanation."""

    instruction_id = "custom:date_format_list"
    DESCRIPTION = (
        "List the start dates of all the battles Napoleon fought separated by commas, use the following date "
        "format: YYYY-MM-DD. Do not provide an explanation."
    )

    DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

    def check_following(self, text: str) -> bool:
        items = [item.strip() for item in text.strip().split(",")]
        for item in items:
            match = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", item)
            if not match:
                return False
            year, month, day = (int(part) for part in match.groups())
            if not (1769 <= year <= 1821 and 1 <= month <= 12 and 1 <= day <= self.DAYS[month - 1]):
                return False
        return True
