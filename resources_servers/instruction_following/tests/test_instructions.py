"""Golden cases for every instruction kind: passing and failing answers, boundaries, empty text, unicode."""

import time

import pytest

from resources_servers.instruction_following.instructions import (
    INSTRUCTION_REGISTRY,
    InstructionArgumentError,
    check_instruction,
)
from resources_servers.instruction_following.text_utils import (
    count_sentences,
    count_words,
    split_on_blank_lines,
    split_on_marker,
    split_sentences,
)

IFEVAL_IDS = {
    "length_constraints:number_words",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:nth_paragraph_first_word",
    "keywords:existence",
    "keywords:forbidden_words",
    "keywords:frequency",
    "keywords:letter_frequency",
    "change_case:english_lowercase",
    "change_case:english_capital",
    "change_case:capital_word_frequency",
    "detectable_format:json_format",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:title",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "startend:end_checker",
    "startend:quotation",
    "punctuation:no_comma",
    "combination:repeat_prompt",
    "combination:two_responses",
}


def followed(instruction_id: str, kwargs, text: str) -> bool:
    ok, error = check_instruction(instruction_id, kwargs, text)
    assert error is None, error
    return ok


# The IFEval ids and ours; the IF-RLVR and IFBench families, and language:response_language (it needs the optional
# langdetect package), have their own golden cases in test_ifbench.py.
IFEVAL_AND_OURS = IFEVAL_IDS | {"startend:start_checker"}


def test_registry_holds_the_ifeval_ids_and_ours():
    assert IFEVAL_AND_OURS | {"language:response_language"} <= set(INSTRUCTION_REGISTRY)
    for instruction_id, cls in INSTRUCTION_REGISTRY.items():
        assert cls.instruction_id == instruction_id


CASES = [
    # ---------------------------------------------------------------------------------------------- words
    ("length_constraints:number_words", {"num_words": 5, "relation": "less than"}, "one two three four", True),
    ("length_constraints:number_words", {"num_words": 4, "relation": "less than"}, "one two three four", False),
    ("length_constraints:number_words", {"num_words": 4, "relation": "at least"}, "one two three four", True),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four", False),
    ("length_constraints:number_words", {"num_words": 1, "relation": "less than"}, "", True),
    ("length_constraints:number_words", {"num_words": 1, "relation": "at least"}, "", False),
    ("length_constraints:number_words", {"num_words": 0, "relation": "at least"}, "", True),
    ("length_constraints:number_words", {"num_words": 3, "relation": "at least"}, "Grüße aus Köln!", True),
    ("length_constraints:number_words", {"num_words": 3, "relation": "less than"}, "— ... !!! ***", True),
    ("length_constraints:number_words", {"num_words": 3.0, "relation": "at least"}, "a b c", True),
    # ------------------------------------------------------------------------------------------ sentences
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "One. Two!", True),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"}, "One. Two!", False),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"}, "One. Two?", True),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "at least"}, "One. Two?", False),
    ("length_constraints:number_sentences", {"num_sentences": 1, "relation": "less than"}, "", True),
    ("length_constraints:number_sentences", {"num_sentences": 1, "relation": "at least"}, "   ", False),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"},
     "Dr. Smith met J. R. R. Tolkien, e.g. at No. 5 Baker St. in 1950.", True),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"}, "你好。很好！", True),
    # ---------------------------------------------------------------------------------------- paragraphs
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part. *** Second part.", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "First part.\n***\nSecond part.", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 1}, "Just one paragraph.", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "***\nA\n***\nB\n***", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "A\n***\n\n***\nB", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 1}, "A ***bold italic*** word", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 1}, "", False),
    # ---------------------------------------------------------------------------------- nth first word
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First we mix.\n\nThen we bake.", True),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "Then"},
     "First we mix.\n  \n\n**\"Then,\" we bake.**", True),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First we mix.\n\nAfter that we bake.", False),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First we mix.\n\nThen we bake.\n\nThen we eat.", False),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "then"},
     "Thence we go.\n\nThen we bake.", False),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "ünd"},
     "\n\nÜnd so weiter.\n\n", True),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "a"},
     "", False),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "Sure,"},
     "sure! here it is.", True),
    # ------------------------------------------------------------------------------------------ keywords
    ("keywords:existence", {"keywords": ["river", "Compass"]}, "Take a COMPASS along the River.", True),
    ("keywords:existence", {"keywords": ["river", "compass"]}, "Take a compass.", False),
    ("keywords:existence", {"keywords": ["art"]}, "Start early.", True),
    ("keywords:existence", {"keywords": ["c++"]}, "I write C++ daily.", True),
    ("keywords:existence", {"keywords": ["café"]}, "Meet me at the CAFÉ.", True),
    ("keywords:existence", {"keywords": ["river"]}, "", False),
    ("keywords:forbidden_words", {"forbidden_words": ["lost", "danger"]}, "Stay on the path.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["lost", "danger"]}, "You could get LOST!", False),
    ("keywords:forbidden_words", {"forbidden_words": ["cat"]}, "A category and a concatenation.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["ice cream"]}, "I love ice-cream.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["ice cream"]}, "I love ice\n  cream.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["ice cream"]}, "I love Ice Cream.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["über"]}, "Das ist Über alles.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["lost"]}, "", True),
    ("keywords:frequency", {"keyword": "zebra", "frequency": 2, "relation": "at least"}, "Zebra, zebras!", True),
    ("keywords:frequency", {"keyword": "zebra", "frequency": 3, "relation": "at least"}, "Zebra, zebras!", False),
    ("keywords:frequency", {"keyword": "zebra", "frequency": 2, "relation": "less than"}, "One zebra.", True),
    ("keywords:frequency", {"keyword": "zebra", "frequency": 1, "relation": "less than"}, "One zebra.", False),
    ("keywords:frequency", {"keyword": "aa", "frequency": 2, "relation": "at least"}, "aaa", False),  # no overlaps
    ("keywords:frequency", {"keyword": "zebra", "frequency": 1, "relation": "less than"}, "", True),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 3, "let_relation": "at least"}, "Zig zag z", True),
    ("keywords:letter_frequency", {"letter": "Z", "let_frequency": 4, "let_relation": "at least"}, "Zig zag z", False),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 3, "let_relation": "less than"}, "Zig zag z", False),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 1, "let_relation": "less than"}, "", True),
    ("keywords:letter_frequency", {"letter": "é", "let_frequency": 2, "let_relation": "at least"}, "Élan é", True),
    # ---------------------------------------------------------------------------------------------- case
    ("change_case:english_lowercase", None, "all lowercase, even 42 digits.", True),
    ("change_case:english_lowercase", None, "almost all lowercase. But not this.", False),
    ("change_case:english_lowercase", None, "straße und café", True),
    ("change_case:english_lowercase", None, "", False),
    ("change_case:english_lowercase", None, "123 !!!", False),
    ("change_case:english_capital", None, "ALL CAPS, 42 TIMES!", True),
    ("change_case:english_capital", None, "ALL CAPS except one", False),
    ("change_case:english_capital", None, "ÄRGER ÜBER ÖL", True),
    ("change_case:english_capital", None, "", False),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     "NASA and the ESA met.", True),
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "at least"},
     "NASA and the ESA met. Nope.", False),
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "less than"},
     "NASA, ESA and I.", False),
    ("change_case:capital_word_frequency", {"capital_frequency": 1, "capital_relation": "less than"},
     "no shouting 123 here", True),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"},
     "DON'T X-RAY it", False),
    ("change_case:capital_word_frequency", {"capital_frequency": 1, "capital_relation": "less than"}, "", True),
    # -------------------------------------------------------------------------------------------- format
    ("detectable_format:json_format", None, '{"a": [1, 2]}', True),
    ("detectable_format:json_format", None, '  ```json\n{"a": "b"}\n```  ', True),
    ("detectable_format:json_format", None, '```JSON\n[1, 2]\n```', True),
    ("detectable_format:json_format", None, '```\n{"a": "ü"}```', True),
    ("detectable_format:json_format", None, 'Here you go: {"a": 1}', False),
    ("detectable_format:json_format", None, '```json\n{"a": 1}\n``` and more', False),
    ("detectable_format:json_format", None, '{"a": 1', False),
    ("detectable_format:json_format", None, "", False),
    ("detectable_format:json_format", None, "[" * 100_000 + "]" * 100_000, False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "* one\n* two\n- three", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "Intro\n  * one\n\t- two\n+ three\nOutro", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "* one\n* two", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two\n* three", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "* one\n---\n***\n**bold** line\n-5 degrees", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 0}, "", True),
    ("detectable_format:constrained_response", None, "My answer is yes.", True),
    ("detectable_format:constrained_response", None, "Thinking about it... my answer is maybe.", True),
    ("detectable_format:constrained_response", None, "Yes.", False),
    ("detectable_format:constrained_response", None, "My answer is yes. My answer is no.", False),
    ("detectable_format:constrained_response", None, "", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 3}, "*one* and **two**", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "** ** and * * and 2 * 3 * 4", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "* item\n* other item", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "*ünïcödé*", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 0}, "", True),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nIntro.\n\n## Section 2: Body\nMore.", True),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "**SECTION 1**\nA\nSECTION 2\nB", True),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "Section 1\nA\nSection 2\nB", False),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nAs said in Section 2, ...", False),
    ("detectable_format:multiple_sections", {"num_sections": 1}, "Section 1 only", True),
    ("detectable_format:multiple_sections", {"section_spliter": "Part", "num_sections": 1}, "", False),
    ("detectable_format:title", None, "<<A Poem of Joy>>\nHello.", True),
    ("detectable_format:title", None, "Intro then <<Ünïcode Title>>", True),
    ("detectable_format:title", None, "<< >> no title", False),
    ("detectable_format:title", None, "<<split\ntitle>>", False),
    ("detectable_format:title", None, "", False),
    # ------------------------------------------------------------------------------------------- content
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [address].", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 3}, "Dear [name], at [address].", False),
    ("detectable_content:number_placeholders", {"num_placeholders": 1}, "[ ] and [link](http://x.y)", False),
    ("detectable_content:number_placeholders", {"num_placeholders": 1}, "[名前]", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 0}, "", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. See you soon.", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n**p. s.** see you", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.S. one\nP.P.S two", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.S. only one", False),
    ("detectable_content:postscript", {}, "Hi.\nP.S. default marker", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi, no postscript here.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "", False),
    # ----------------------------------------------------------------------------------------- start/end
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?", True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, '"Done. any other\nquestions?"\n', True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Bye.", False),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "", False),
    ("startend:end_checker", {"end_phrase": "Tschüß!"}, "Bis bald. Tschüß!", True),
    ("startend:start_checker", {"start_phrase": "Here is your guide"}, "  Here is your  guide: ...", True),
    ("startend:start_checker", {"start_phrase": "Here is your guide"}, "“here is your guide”", True),
    ("startend:start_checker", {"start_phrase": "Here is your guide"}, "So, here is your guide", False),
    ("startend:start_checker", {"start_phrase": "Here is your guide"}, "", False),
    ("startend:quotation", None, '"Wrapped in quotes."', True),
    ("startend:quotation", None, "  “Curly quotes work too.”\n", True),
    ("startend:quotation", None, '"Only at the start.', False),
    ("startend:quotation", None, '"', False),
    ("startend:quotation", None, "", False),
    # --------------------------------------------------------------------------------------- punctuation
    ("punctuation:no_comma", None, "No commas here at all.", True),
    ("punctuation:no_comma", None, "One, two.", False),
    ("punctuation:no_comma", None, "中文，逗号", False),
    ("punctuation:no_comma", None, "", True),
    # --------------------------------------------------------------------------------------- combination
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about cats."},
     "Write a poem about cats.\nCats nap in the sun.", True),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about cats."},
     "  write a poem  about\ncats. Cats nap.", True),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about cats."}, "Sure! Write a poem about cats.",
     False),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about cats."}, "", False),
    ("combination:two_responses", None, "First answer.\n******\nSecond answer.", True),
    ("combination:two_responses", None, "******\nFirst.\n******\nSecond.\n******", True),
    ("combination:two_responses", None, "Same.\n******\nSame.", False),
    ("combination:two_responses", None, "One.\n******\n\n******\nTwo.", False),
    ("combination:two_responses", None, "One.\n******\nTwo.\n******\nThree.", False),
    ("combination:two_responses", None, "Only one.", False),
    ("combination:two_responses", None, "", False),
]


@pytest.mark.parametrize(("instruction_id", "kwargs", "text", "expected"), CASES)
def test_golden_case(instruction_id, kwargs, text, expected):
    assert followed(instruction_id, kwargs, text) is expected


def test_every_kind_has_a_passing_and_a_failing_case():
    for instruction_id in IFEVAL_AND_OURS:
        outcomes = {expected for case_id, _, _, expected in CASES if case_id == instruction_id}
        assert outcomes == {True, False}, instruction_id


def test_every_kind_is_checked_on_empty_text():
    empty = {case_id for case_id, _, text, _ in CASES if text == ""}
    assert empty == IFEVAL_AND_OURS


# ----------------------------------------------------------------------------------------- kwargs handling


def test_null_kwargs_are_dropped_before_building():
    # IFEval exports list every kwarg name, with null for the ones an instruction does not use.
    kwargs = {"num_words": 3, "relation": "at least", "keywords": None, "end_phrase": None}
    assert followed("length_constraints:number_words", kwargs, "a b c")
    assert followed("punctuation:no_comma", {"num_words": None, "keywords": None}, "fine")
    assert followed("punctuation:no_comma", None, "fine") and followed("punctuation:no_comma", {}, "fine")


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "message"),
    [
        ("length_constraints:number_words", None, "missing"),
        ("length_constraints:number_words", {"num_words": None, "relation": "at least"}, "missing"),
        ("length_constraints:number_words", {"num_words": 3, "relation": "at most"}, "relation must be one of"),
        ("length_constraints:number_words", {"num_words": -1, "relation": "at least"}, "at least 0"),
        ("length_constraints:number_words", {"num_words": "3", "relation": "at least"}, "whole number"),
        ("length_constraints:number_words", {"num_words": 2.5, "relation": "at least"}, "whole number"),
        ("length_constraints:number_words", {"num_words": True, "relation": "at least"}, "whole number"),
        ("length_constraints:number_paragraphs", {"num_paragraphs": 0}, "at least 1"),
        ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"},
         "after the last"),
        ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "?!"},
         "must contain a word"),
        ("keywords:existence", {"keywords": []}, "non-empty list"),
        ("keywords:existence", {"keywords": ["ok", " "]}, "non-empty string"),
        ("keywords:letter_frequency", {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},
         "single letter"),
        ("keywords:letter_frequency", {"letter": "1", "let_frequency": 1, "let_relation": "at least"}, "single letter"),
        ("punctuation:no_comma", {"unexpected": 1}, "unexpected keyword argument 'unexpected'"),
        ("startend:end_checker", {"end_phrase": ""}, "non-empty string"),
    ],
)
def test_invalid_kwargs_fail_the_instruction_with_a_reason(instruction_id, kwargs, message):
    ok, error = check_instruction(instruction_id, kwargs, "a b c")
    assert ok is False
    assert error.startswith(f"invalid kwargs for {instruction_id}: ") and message in error, error


def test_single_string_keyword_list_is_accepted():
    assert followed("keywords:existence", {"keywords": "river"}, "by the river")


def test_unknown_instruction_id():
    assert check_instruction("language:klingon", {"x": 1}, "text") == (
        False,
        "unknown instruction id 'language:klingon'",
    )
    assert check_instruction("", None, "text") == (False, "unknown instruction id ''")


def test_known_but_unsupported_instruction_says_so():
    ok, error = check_instruction("words:start_verb", None, "Run home.")
    assert ok is False
    assert error.startswith("instruction 'words:start_verb' is not supported: it needs a part-of-speech tagger")


def test_checker_exception_is_caught(monkeypatch):
    cls = INSTRUCTION_REGISTRY["punctuation:no_comma"]

    def boom(self, text):
        raise RuntimeError("bug")

    monkeypatch.setattr(cls, "check_following", boom)
    assert check_instruction("punctuation:no_comma", None, "x") == (
        False,
        "punctuation:no_comma failed while checking: RuntimeError: bug",
    )


def test_build_description_and_args():
    checker = INSTRUCTION_REGISTRY["keywords:frequency"]("keywords:frequency")
    description = checker.build_description(keyword=" zebra ", frequency=2.0, relation="at least")
    assert "zebra" in description and "at least 2" in description
    assert checker.get_instruction_args() == {"keyword": "zebra", "frequency": 2, "relation": "at least"}
    assert checker.get_instruction_args_keys() == ["keyword", "frequency", "relation"]
    with pytest.raises(InstructionArgumentError):
        checker.build_description(keyword="zebra", frequency=2, relation="about")
    with pytest.raises(TypeError):
        checker.build_description(keyword="zebra")
    for instruction_id, cls in INSTRUCTION_REGISTRY.items():
        assert cls(instruction_id).id == instruction_id
    words = INSTRUCTION_REGISTRY["length_constraints:number_words"]()
    assert words.id == "length_constraints:number_words"
    assert words.build_description(num_words=300.0, relation="less than") == "Answer with fewer than 300 words."


# ---------------------------------------------------------------------------------------------- text utils


def test_count_words():
    assert count_words("") == 0
    assert count_words("Hello, world!") == 2
    assert count_words("don't stop-me now") == 5  # \w+ runs, as the IFEval counting rule
    assert count_words("naïve café 東京") == 3


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("", []),
        ("No final period", ["No final period"]),
        ("One. Two? Three! Four", ["One.", "Two?", "Three!", "Four"]),
        ("Wait... what?! Really.", ["Wait...", "what?!", "Really."]),
        ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
        ("Pi is 3.14 and example.com is a site.", ["Pi is 3.14 and example.com is a site."]),
        ("Mr. and Mrs. Smith vs. Dr. Who.", ["Mr. and Mrs. Smith vs. Dr. Who."]),
        ("Fruits, e.g. apples. The U.S. Army.", ["Fruits, e.g. apples.", "The U.S. Army."]),
        ("Steps:\n1. Mix it.\n2. Bake it.", ["Steps:\n1. Mix it.", "2. Bake it."]),
        ("I got 2. Then 3.", ["I got 2.", "Then 3."]),
        ("See No. 5 now. No. I refuse.", ["See No. 5 now.", "No.", "I refuse."]),
        ("A line\nwithout marks", ["A line\nwithout marks"]),
        ("... !!! ?", []),
        ("第一句。第二句！", ["第一句。", "第二句！"]),
    ],
)
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences
    assert count_sentences(text) == len(sentences)


def test_paragraph_splitting():
    assert split_on_blank_lines("a\n\nb\n \t\n\n c \n\n") == ["a", "b", "c"]
    assert split_on_blank_lines("a\nb") == ["a\nb"]
    assert split_on_marker("a *** b\n***\nc", "***") == ["a ", " b\n", "\nc"]
    assert split_on_marker("a ****** b ***x*** c", "***") == ["a ****** b ***x*** c"]


def test_degenerate_output_is_checked_in_linear_time():
    long_inputs = [
        "a. " * 50_000,
        "[" + "a" * 100_000,
        "<" * 100_000,
        "*a " * 50_000,
        "\n" * 100_000 + " " * 100_000,
        "```\n" + " " * 100_000,
        "x" * 100_000 + ". ",
        "1. " * 50_000,
    ]
    kinds = [
        ("length_constraints:number_sentences", {"num_sentences": 1, "relation": "at least"}),
        ("detectable_content:number_placeholders", {"num_placeholders": 1}),
        ("detectable_format:title", None),
        ("detectable_format:number_highlighted_sections", {"num_highlights": 1}),
        ("detectable_format:multiple_sections", {"num_sections": 1}),
        ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "a"}),
        ("detectable_content:postscript", {}),
        ("detectable_format:json_format", None),
    ]
    started = time.perf_counter()
    for text in long_inputs:
        for instruction_id, kwargs in kinds:
            check_instruction(instruction_id, kwargs, text)
    assert time.perf_counter() - started < 10.0
