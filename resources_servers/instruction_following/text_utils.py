"""Offline text splitting for the instruction checkers: words, sentences, paragraphs.

Everything here is plain `re` over the text: no tokenizer models, nothing downloaded at run time, and every
pattern is linear in the length of the text (model output can be long and degenerate).
"""

import re

# ------------------------------------------------------------------------------------------------------ words

# A word is a run of letters, digits or underscores (any script). "don't" is two words and "state-of-the-art"
# four: the counting rule of the IFEval benchmark, which its word-count thresholds were chosen with.
_WORD = re.compile(r"\w+")

# A token for case checks: words joined by apostrophes, hyphens or dots ("DON'T", "U.S.A", "X-RAY").
_CASED_TOKEN = re.compile(r"\w+(?:['’.\-]\w+)*")


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def count_words(text: str) -> int:
    return len(words(text))


def case_tokens(text: str) -> list[str]:
    return _CASED_TOKEN.findall(text)


# -------------------------------------------------------------------------------------------------- sentences

# A run of sentence-ending marks with the closing quotes/brackets that follow it: `.`, `?!`, `...`, `."`, `!)`.
_TERMINATOR_RUN = re.compile(r"[.!?…。！？]+[\"'”’)\]»」』]*")
_CJK_TERMINATORS = frozenset("。！？")
_ALNUM = re.compile(r"[^\W_]")
_DIGIT_AHEAD = re.compile(r"\s*\d")
# Single letters with periods: initials and dotted acronyms ("J", "e.g", "U.S"), the final period excluded.
_DOTTED_LETTERS = re.compile(r"(?:[^\W\d_]\.)*[^\W\d_]")
# Titles and short forms that are followed by a period but almost never end a sentence.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt rev hon gen col capt lt sgt gov sen rep vs approx fig cf al ca".split()
)


def _is_boundary(text: str, run: re.Match) -> bool:
    """Whether a run of terminators ends a sentence. Looks only at the token before the run and the character
    after it, so splitting a whole text stays linear."""
    end = run.end()
    marks = run.group().rstrip("\"'”’)]»」』")
    if end < len(text) and not text[end].isspace():
        # Glued to the next character: "3.14", "example.com", "e.g.this". CJK punctuation needs no space.
        return marks[-1] in _CJK_TERMINATORS
    if marks != "." or end == len(text):
        return True  # "?", "!", "...", "?!" followed by a space, or the end of the text
    token_start = run.start()
    while token_start > 0 and not text[token_start - 1].isspace():
        token_start -= 1
    token = text[token_start : run.start()].lstrip("\"'“‘([{*_")
    if token.lower() in _ABBREVIATIONS or _DOTTED_LETTERS.fullmatch(token):
        return False  # "Dr. Smith", "J. R. R. Tolkien", "e.g. apples"
    if token.lower() == "no" and _DIGIT_AHEAD.match(text, end):
        return False  # "No. 5"
    if token.isdigit():
        before = token_start
        while before > 0 and text[before - 1] in " \t":
            before -= 1
        if before == 0 or text[before - 1] == "\n":
            return False  # a numbered-list marker at the start of a line: "1. Preheat the oven."
    return True


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, in order.

    A sentence ends at `.`, `!`, `?`, `…` (or a run of them, with closing quotes/brackets) followed by whitespace
    or the end of the text, and at the CJK marks `。！？`. A period does not end a sentence after a title or
    short form (`Dr.`, `vs.`), after initials and dotted acronyms (`J.`, `e.g.`, `U.S.`), in `No. 5`, or after a
    list number at the start of a line (`1.`). Line breaks alone do not end a sentence. Text after the last mark
    is a sentence too. Pieces without any letter or digit ("...", "!!!") are not sentences.
    """
    sentences: list[str] = []
    start = 0
    for run in _TERMINATOR_RUN.finditer(text):
        if _is_boundary(text, run):
            sentences.append(text[start : run.end()].strip())
            start = run.end()
    sentences.append(text[start:].strip())
    return [sentence for sentence in sentences if _ALNUM.search(sentence)]


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


# ------------------------------------------------------------------------------------------------- paragraphs

# A line break, then one or more lines holding only whitespace.
_BLANK_LINES = re.compile(r"\n[^\S\n]*\n\s*")


def split_on_blank_lines(text: str) -> list[str]:
    """Paragraphs separated by one or more blank lines, stripped; empty pieces dropped."""
    return [piece.strip() for piece in _BLANK_LINES.split(text) if piece.strip()]


def split_on_marker(text: str, marker: str) -> list[str]:
    """Split on a standalone marker such as `***`: the marker with whitespace (or the start/end of the text) on
    both sides, so `***bold italic***` and a longer run of asterisks are not separators. Pieces are not
    stripped or filtered: the caller decides what an empty piece means."""
    pattern = r"(?:(?<=\s)|^)" + re.escape(marker) + r"(?=\s|$)"
    return re.split(pattern, text)
