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


# ------------------------------------------------------------------------------------- words, other readings

# A word with its inner apostrophes and hyphens kept ("don't", "state-of-the-art" are one word each), no dots.
_JOINED_WORD = re.compile(r"\w+(?:['’\-]\w+)*")
# ASCII punctuation, as Python's `string.punctuation`, plus the typographic quotes and dashes models write.
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~“”‘’–—…«»"
_PUNCTUATION_TABLE = str.maketrans("", "", PUNCTUATION)


def joined_words(text: str) -> list[str]:
    return _JOINED_WORD.findall(text)


def without_punctuation(text: str) -> str:
    return text.translate(_PUNCTUATION_TABLE)


def bare_words(text: str) -> list[str]:
    """Lowercased whitespace-separated words with every punctuation mark removed ("Don't!" -> "dont"); pieces
    that were only punctuation disappear."""
    return without_punctuation(text).lower().split()


def trim_punctuation(word: str) -> str:
    """The word without punctuation (and markdown emphasis) at either end: `"**Hello,**"` -> `Hello`."""
    return word.strip(PUNCTUATION + " \t\n")


def edge_words(text: str) -> list[str]:
    """Whitespace-separated words with the punctuation at their ends trimmed; pieces that were only punctuation
    disappear. Inner punctuation stays ("don't", "3.14")."""
    return [word for word in (trim_punctuation(piece) for piece in text.split()) if word]


# ----------------------------------------------------------------------------------------------- characters

# Pictographic code points (emoji proper, symbols and pictographs, dingbats, regional indicators, keycaps).
_EMOJI_RANGES = (
    (0x1F000, 0x1FAFF),  # mahjong, cards, enclosed alphanumerics/ideographs, pictographs, emoticons, transport...
    (0x2600, 0x27BF),  # miscellaneous symbols and dingbats
    (0x2300, 0x23FF),  # watch, hourglass, keyboard, media buttons
    (0x2B00, 0x2BFF),  # arrows, stars, large circles and squares
    (0x2190, 0x21FF),  # arrows used as emoji
    (0x3030, 0x3030),
    (0x303D, 0x303D),
    (0x3297, 0x3299),
    (0x00A9, 0x00A9),
    (0x00AE, 0x00AE),
    (0x203C, 0x203C),
    (0x2049, 0x2049),
    (0x2122, 0x2122),
    (0x2139, 0x2139),
    (0x24C2, 0x24C2),
    (0x25AA, 0x25FE),
    (0xE0020, 0xE007F),  # tag characters of flag sequences
)
# Joiners and modifiers that sit inside or after an emoji: ZWJ, variation selectors, skin tones, keycap.
_EMOJI_MODIFIERS = frozenset(
    [0x200D, 0xFE0E, 0xFE0F, 0x20E3] + list(range(0x1F3FB, 0x1F400))
)


def is_emoji(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _EMOJI_RANGES)


def strip_emoji_modifiers(text: str) -> str:
    """`text` without trailing/leading joiners, variation selectors and skin-tone modifiers."""
    start, end = 0, len(text)
    while end > start and ord(text[end - 1]) in _EMOJI_MODIFIERS:
        end -= 1
    while start < end and ord(text[start]) in _EMOJI_MODIFIERS:
        start += 1
    return text[start:end]


_JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")  # hiragana, katakana, CJK ideographs


def has_japanese(text: str) -> bool:
    return _JAPANESE.search(text) is not None


# ------------------------------------------------------------------------------------------------ syllables

_VOWEL_GROUP = re.compile(r"[aeiouy]+")


def count_syllables(word: str) -> int:
    """An estimate of the syllables of an English word: vowel groups (y counts as a vowel), less a silent final
    `e` ("make", but not "table" or "be"), less `-es`/`-ed` endings that add no syllable ("makes", "jumped",
    but not "wanted" or "buses"). At least 1 for any word with a letter. Irregular words can be off by one."""
    word = "".join(char for char in word.lower() if char.isalpha())
    if not word:
        return 0
    count = len(_VOWEL_GROUP.findall(word))
    if len(word) > 2 and word.endswith("e") and not word.endswith(("le", "ee", "ye")) and word[-2] not in "aeiouy":
        count -= 1
    elif len(word) > 3 and word.endswith(("es", "ed")) and word[-3] not in "aeiouytdsxzhg":
        count -= 1
    return max(count, 1)
