"""The IF-RLVR training families and the IFBench families: golden passing and failing answers for every id, the
counting relations at their boundaries, kwargs validation, request validation of unknown ids, and re-grading the
rollout NeMo Gym v0.2 publishes with its reward."""

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from resources_servers.instruction_following.app import (
    InstructionFollowingResourcesServer,
    InstructionFollowingResourcesServerConfig,
    InstructionFollowingVerifyRequest,
)
from resources_servers.instruction_following.instructions import (
    INSTRUCTION_REGISTRY,
    NOT_SUPPORTED,
    InstructionValidationError,
    build_instruction,
    check_instruction,
    validate_instructions,
)
from resources_servers.instruction_following.text_utils import count_syllables, is_emoji

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The ids of open-instruct's IF-RLVR training set ("IFEvalG") beyond IFEval: NeMo Gym v0.2's data uses these.
IF_RLVR_IDS = {
    "copy:repeat_phrase",
    "copy:copy",
    "new:copy_span_idx",
    "detectable_format:sentence_hyphens",
    "keywords:no_adjacent_consecutive",
    "detectable_format:square_brackets",
    "keywords:word_once",
    "keywords:word_count_different_numbers",
    "keywords:exclude_word_harder",
    "paragraphs:paragraphs",
    "paragraphs:paragraphs2",
    "first_word:first_word_sent",
    "first_word:first_word_answer",
    "last_word:last_word_sent",
    "last_word:last_word_answer",
    "detectable_format:bigram_wrapping",
    "copy:copying_simple",
    "copy:copying_multiple",
    "punctuation:punctuation_dot",
    "punctuation:punctuation_exclamation",
    "count:lowercase_counting",
    "letters:letter_counting",
    "letters:letter_counting2",
    "count:counting_composition",
    "count:count_unique",
    "count:count_increment_word",
    "keywords:palindrome",
    "keywords:keyword_specific_position",
    "keywords:start_end",
}

# IFBench's out-of-distribution ids (words:start_verb is known but not supported: it needs a POS tagger).
IFBENCH_IDS = {
    "count:word_count_range", "count:unique_word_count", "ratio:stop_words", "ratio:sentence_type",
    "ratio:sentence_balance", "count:conjunctions", "count:person_names", "ratio:overlap", "count:numbers",
    "words:alphabet", "words:vowel", "words:consonants", "sentence:alliteration_increment", "words:palindrome",
    "count:punctuation", "format:parentheses", "format:quotes", "words:prime_lengths", "format:options",
    "format:newline", "format:emoji", "ratio:sentence_words", "count:words_japanese", "words:repeats",
    "sentence:keyword", "count:pronouns", "words:odd_even_syllables", "words:last_first",
    "words:paragraph_last_first", "sentence:increment", "words:no_consecutive", "format:line_indent",
    "format:quote_unquote", "format:list", "format:thesis", "format:sub-bullets", "format:no_bullets_bullets",
    "custom:multiples", "custom:mcq_count_length", "custom:reverse_newline", "custom:word_reverse",
    "custom:character_reverse", "custom:sentence_alphabet", "custom:european_capitals_sort", "custom:csv_city",
    "custom:csv_special_character", "custom:csv_quotes", "custom:date_format_list", "count:keywords_multiple",
    "words:keywords_specific_position", "words:words_position", "repeat:repeat_change", "repeat:repeat_simple",
    "repeat:repeat_span", "format:title_case", "format:output_template", "format:no_whitespace",
}  # fmt: skip

PROMPT = "Write a short poem about the sea."
CAPITALS = (
    "Reykjavik, Helsinki, Oslo, Tallinn, Stockholm, Riga, Moscow, Copenhagen, Vilnius, Minsk, Dublin, Berlin, "
    "Amsterdam, Warsaw, London, Brussels, Prague, Luxembourg, Paris, Vienna, Bratislava, Budapest, Vaduz, "
    "Chisinau, Bern, Ljubljana, Zagreb"
)
AFRICA = (
    "Algeria Angola Benin Botswana Burkina-Faso Burundi Cabo-Verde Cameroon Central-African-Republic Chad Comoros "
    "Congo Djibouti Egypt Equatorial-Guinea Eritrea Eswatini Ethiopia Gabon Gambia Ghana Guinea Guinea-Bissau "
    "Ivory-Coast Kenya Lesotho Liberia Libya Madagascar Malawi Mali Mauritania Mauritius Morocco Mozambique "
    "Namibia Niger Nigeria Rwanda São-Tomé-and-Príncipe Senegal Seychelles Sierra-Leone Somalia South-Africa "
    "South-Sudan Sudan Tanzania Togo Tunisia Uganda Zambia Zimbabwe"
).split()
AFRICA_REVERSED = "\n".join(name.replace("-", " ") for name in reversed(AFRICA))
STORY = " ".join(f"{letter.upper()}{'x' * 3} went home." for letter in "abcdefghijklmnopqrstuvwxyz")
MCQ = "\n".join(
    f"Question {number}: {text}\nA. one\nB. two\nC. three\nD. four\nE. five"
    for number, text in enumerate(["Who?", "Who painted?", "Who painted Guernica?", "Who painted Guernica in 1937?"], 1)
)

AT_LEAST_2_SEA = {"keyword": "sea", "frequency": 2, "relation": "at least"}

CASES = [
    # ------------------------------------------------------------------------------------------ copy
    ("copy:copy", {"prompt_to_repeat": PROMPT}, "write a short  poem about the sea.", True),
    ("copy:copy", {"prompt_to_repeat": PROMPT}, PROMPT + " Here it is: waves.", False),
    ("copy:copy", {"prompt_to_repeat": PROMPT}, "", False),
    ("copy:copying_simple", {"prompt_to_repeat": PROMPT}, f"  {PROMPT}\n", True),
    ("copy:copying_simple", {"prompt_to_repeat": PROMPT}, "Sure! " + PROMPT, False),
    ("copy:copying_simple", {"prompt_to_repeat": PROMPT}, "", False),
    ("copy:copying_multiple", {"prompt_to_repeat": PROMPT, "N": 2}, f"{PROMPT}\n******\n{PROMPT}", True),
    ("copy:copying_multiple", {"prompt_to_repeat": PROMPT, "N": 2}, f"{PROMPT}\n******\n{PROMPT}\n******", True),
    ("copy:copying_multiple", {"prompt_to_repeat": PROMPT, "N": 3}, f"{PROMPT}\n******\n{PROMPT}", False),
    ("copy:copying_multiple", {"prompt_to_repeat": PROMPT, "N": 2}, f"{PROMPT}\n******\nA poem.", False),
    ("copy:copying_multiple", {"prompt_to_repeat": PROMPT, "N": 2}, "", False),
    ("new:copy_span_idx", {"prompt_to_repeat": PROMPT, "n_start": 8, "n_end": 18}, "short poem", True),
    ("new:copy_span_idx", {"prompt_to_repeat": PROMPT, "n_start": 8, "n_end": 18}, "short poem ", True),
    ("new:copy_span_idx", {"prompt_to_repeat": PROMPT, "n_start": 8, "n_end": 19}, "short poem a", True),
    ("new:copy_span_idx", {"prompt_to_repeat": PROMPT, "n_start": 8, "n_end": 19}, "short poem", True),
    ("new:copy_span_idx", {"prompt_to_repeat": PROMPT, "n_start": 8, "n_end": 18}, "a short poem", False),
    ("new:copy_span_idx", {"prompt_to_repeat": PROMPT, "n_start": 8, "n_end": 18}, "", False),
    (
        "copy:repeat_phrase",
        {"phrase": "The early bird catches the worm", "small_n": 2},
        "The early cat catches the worm. Then: the early bird eats the worm!",
        True,
    ),
    (
        "copy:repeat_phrase",
        {"phrase": "The early bird catches the worm", "small_n": 2},
        "The early bird catches the worm. The early bird catches the worm.",
        False,  # no word replaced
    ),
    (
        "copy:repeat_phrase",
        {"phrase": "The early bird catches the worm", "small_n": 2},
        "The early cat catches the worm.",
        False,  # once, not twice
    ),
    (
        "copy:repeat_phrase",
        {"phrase": "The early bird catches the worm", "small_n": 1},
        "The late cat catches the worm.",
        False,  # two words replaced
    ),
    ("copy:repeat_phrase", {"phrase": "The early bird catches the worm", "small_n": 1}, "", False),
    # ---------------------------------------------------------------------------------------- format
    ("detectable_format:sentence_hyphens", None, "I came home.-It was late.-Everyone slept.", True),
    ("detectable_format:sentence_hyphens", None, "I came home. - It was late.", False),
    ("detectable_format:sentence_hyphens", None, "I came home. It was late.", False),
    ("detectable_format:sentence_hyphens", None, "", False),
    ("detectable_format:square_brackets", None, "[Hello] [world,] [friend!]", True),
    ("detectable_format:square_brackets", None, "[Hello] world", False),
    ("detectable_format:square_brackets", None, "", False),
    ("detectable_format:bigram_wrapping", None, "<<I am>> <<at home>> <<with my>> <<cute dog>>.", True),
    ("detectable_format:bigram_wrapping", None, "<<I am>> <<at home>> <<now>>", True),
    ("detectable_format:bigram_wrapping", None, "<<I am at>> <<home now>>", False),
    ("detectable_format:bigram_wrapping", None, "<<I am>> at home", False),
    ("detectable_format:bigram_wrapping", None, "", False),
    # -------------------------------------------------------------------------------------- keywords
    ("keywords:word_once", {"keyword": "river"}, "The River runs.", True),
    ("keywords:word_once", {"keyword": "river"}, "A river by a riverbank.", False),  # counted anywhere, as IFEval
    ("keywords:word_once", {"keyword": "river"}, "", False),
    ("keywords:word_count_different_numbers", AT_LEAST_2_SEA, "Sea sea", True),
    ("keywords:word_count_different_numbers", AT_LEAST_2_SEA, "sea", False),
    ("keywords:word_count_different_numbers", {"keyword": "sea", "frequency": 2, "relation": "less than"}, "sea", True),
    ("keywords:word_count_different_numbers", {"keyword": "sea", "frequency": 1, "relation": "less than"}, "", True),
    ("keywords:word_count_different_numbers", {"keyword": "sea", "frequency": 1, "relation": "at least"}, "", False),
    ("count:count_increment_word", {"keyword1": "cat", "keyword2": "dog"}, "A cat, a dog and another dog.", True),
    ("count:count_increment_word", {"keyword1": "cat", "keyword2": "dog"}, "A cat and a dog.", False),
    ("count:count_increment_word", {"keyword1": "cat", "keyword2": "dog"}, "", False),
    ("keywords:exclude_word_harder", {"keyword": "blue"}, "The sky is bluish today.", True),
    ("keywords:exclude_word_harder", {"keyword": "blue"}, "Blue. That is the sky.", False),
    ("keywords:exclude_word_harder", {"keyword": "blue"}, "The sky is blue", False),
    ("keywords:exclude_word_harder", {"keyword": "blue"}, "", True),
    ("keywords:no_adjacent_consecutive", None, "Cats eat rice.", True),
    ("keywords:no_adjacent_consecutive", None, "Apple banana.", False),
    ("keywords:no_adjacent_consecutive", None, "banana apple", True),
    ("keywords:no_adjacent_consecutive", None, "", True),
    ("keywords:palindrome", None, "We saw a racecar.", True),
    ("keywords:palindrome", None, "I saw a car.", False),  # single letters do not count
    ("keywords:palindrome", None, "", False),
    ("keywords:keyword_specific_position", {"keyword": "blue", "n": 2, "m": 3}, "Hi. The sky, blue today.", True),
    ("keywords:keyword_specific_position", {"keyword": "blue", "n": 2, "m": 3}, "Hi. The blue sky.", False),
    ("keywords:keyword_specific_position", {"keyword": "blue", "n": 2, "m": 1}, "Blue sky.", False),
    ("keywords:keyword_specific_position", {"keyword": "blue", "n": 1, "m": 1}, "", False),
    ("keywords:start_end", None, "Hope is what keeps us going, hope", True),
    ("keywords:start_end", None, "Hope is what keeps us going, hope.", False),
    ("keywords:start_end", None, "Hope", False),
    ("keywords:start_end", None, "", False),
    # ------------------------------------------------------------------------------------ paragraphs
    ("paragraphs:paragraphs", None, "First part.\n***\nSecond part.", True),
    ("paragraphs:paragraphs", None, "First.\n***\nSecond.\n***\nThird.", False),
    ("paragraphs:paragraphs", None, "First.\n***\n***\nSecond.", False),
    ("paragraphs:paragraphs", None, "", False),
    ("paragraphs:paragraphs2", None, "First part.\n\nSecond part.", True),
    ("paragraphs:paragraphs2", None, "First part.\nSecond part.", False),
    ("paragraphs:paragraphs2", None, "", False),
    # ---------------------------------------------------------------------------------- first / last
    ("first_word:first_word_sent", {"first_word": "yes"}, "Yes, I agree. Yes! \"Yes\" it is.", True),
    ("first_word:first_word_sent", {"first_word": "yes"}, "Yes, I agree. No, wait.", False),
    ("first_word:first_word_sent", {"first_word": ["yes"]}, "", False),
    ("first_word:first_word_answer", {"first_word": "Hello"}, "**Hello** there. Bye.", True),
    ("first_word:first_word_answer", {"first_word": "hello"}, "Well, hello.", False),
    ("first_word:first_word_answer", {"first_word": "hello"}, "", False),
    ("last_word:last_word_sent", {"last_word": "now"}, "Come now. Go now!", True),
    ("last_word:last_word_sent", {"last_word": "now"}, "Come now. Go later.", False),
    ("last_word:last_word_sent", {"last_word": "now"}, "", False),
    ("last_word:last_word_answer", {"last_word": "contest"}, "Everyone practised before the contest.", True),
    ("last_word:last_word_answer", {"last_word": "contest"}, "The contest was fun.", False),
    ("last_word:last_word_answer", {"last_word": "contest"}, "", False),
    # ----------------------------------------------------------------------------------- punctuation
    ("punctuation:punctuation_dot", None, "No dots here at all!", True),
    ("punctuation:punctuation_dot", None, "Pi is 3.14", False),
    ("punctuation:punctuation_dot", None, "", True),
    ("punctuation:punctuation_exclamation", None, "Calm and quiet.", True),
    ("punctuation:punctuation_exclamation", None, "Wow！", False),
    ("punctuation:punctuation_exclamation", None, "", True),
    # -------------------------------------------------------------------------------------- counting
    ("count:lowercase_counting", {"N": 1}, "Two lowercase Words here", False),  # "lowercase" and "here"
    ("count:lowercase_counting", {"N": 2}, "Two lowercase Words here and", False),
    ("count:lowercase_counting", {"N": 2}, "Two lowercase Words here", True),
    ("count:lowercase_counting", {"N": 0}, "", True),
    ("letters:letter_counting", {"N": 5, "relation": "at least"}, "Hello", True),
    ("letters:letter_counting", {"N": 5, "relation": "at least"}, "Hi 123!", False),
    ("letters:letter_counting", {"N": 5, "relation": "less than"}, "Hi 123!", True),
    ("letters:letter_counting", {"N": 5, "relation": "less than"}, "Hello", False),
    ("letters:letter_counting", {"N": 1, "relation": "less than"}, "", True),
    ("letters:letter_counting2", {"letter": "e", "let_frequency": 2, "let_relation": "at least"}, "Eve", True),
    ("letters:letter_counting2", {"letter": "e", "let_frequency": 2, "let_relation": "at least"}, "Ada", False),
    ("letters:letter_counting2", {"letter": "e", "let_frequency": 1, "let_relation": "at least"}, "", False),
    (
        "count:counting_composition",
        {"n_sent": 2, "n_words": 3},
        "I like tea. You like coffee.\n***\nWe drink water. They don't care.\n* * *\n"
        "Birds sing loudly. Cats sleep often.",
        True,
    ),
    (
        "count:counting_composition",
        {"n_sent": 2, "n_words": 3},
        "I like tea. You like coffee.\n***\nWe drink water. They really do care.\n***\nBirds sing loudly. Cats sleep.",
        False,
    ),
    ("count:counting_composition", {"n_sent": 1, "n_words": 2}, "Hi there.\n***\nBye now.", False),
    ("count:counting_composition", {"n_sent": 1, "n_words": 1}, "", False),
    ("count:count_unique", None, "Every word here is different, truly.", True),
    ("count:count_unique", None, "The cat saw the dog.", False),
    ("count:count_unique", None, "", False),
    # ---------------------------------------------------------------------------- IFBench: counting
    ("count:word_count_range", {"min_words": 2, "max_words": 3}, "one two", True),
    ("count:word_count_range", {"min_words": 2, "max_words": 3}, "one two three", True),
    ("count:word_count_range", {"min_words": 2, "max_words": 3}, "one", False),
    ("count:word_count_range", {"min_words": 2, "max_words": 3}, "one two three four", False),
    ("count:word_count_range", {"min_words": 0, "max_words": 3}, "", True),
    ("count:unique_word_count", {"N": 3}, "The cat, the dog and the bird.", True),
    ("count:unique_word_count", {"N": 3}, "Go go GO!", False),
    ("count:unique_word_count", {"N": 1}, "", False),
    ("ratio:stop_words", {"percentage": 50}, "The cat sat quietly.", True),  # 1 of 4
    ("ratio:stop_words", {"percentage": 50}, "It is on the mat.", False),  # 4 of 5
    ("ratio:stop_words", {"percentage": 50}, "The cat.", True),  # exactly 50%
    ("ratio:stop_words", {"percentage": 50}, "", False),
    ("count:conjunctions", {"small_n": 3}, "Tea and cake, but no milk, or juice.", True),
    ("count:conjunctions", {"small_n": 3}, "Tea and cake and AND milk.", False),
    ("count:conjunctions", {"small_n": 1}, "", False),
    ("count:person_names", {"N": 2}, "Emma met Liam and emma.", True),
    ("count:person_names", {"N": 2}, "Emma met Emmanuel.", False),
    ("count:person_names", {"N": 1}, "", False),
    ("count:numbers", {"N": 3}, "I have 3 cats, 1,000 fish and 2.5 dogs.", True),
    ("count:numbers", {"N": 3}, "I have 3 cats and 4 dogs.", False),
    ("count:numbers", {"N": 0}, "", True),
    ("count:punctuation", None, "Hi, you; look: really?! Yes. Wow! Why?", True),
    ("count:punctuation", None, "Hi, you; look: really?! Yes.", False),  # ? and ! only inside the interrobang
    ("count:punctuation", None, "Hi, you; look: really? Yes. Wow!", False),  # no interrobang
    ("count:punctuation", None, "", False),
    ("count:words_japanese", {"N": 2}, "I 猫 like ねこ very 犬.", True),
    ("count:words_japanese", {"N": 2}, "I 猫 like cats", False),
    ("count:words_japanese", {"N": 2}, "I 2024 like", True),  # digits are not checked
    ("count:words_japanese", {"N": 1}, "", False),
    ("count:pronouns", {"N": 3}, "She told him it's mine.", True),
    ("count:pronouns", {"N": 3}, "The cat sat.", False),
    ("count:pronouns", {"N": 1}, "", False),
    (
        "count:keywords_multiple",
        {"keyword1": "a1", "keyword2": "b2", "keyword3": "c3", "keyword4": "d4", "keyword5": "e5"},
        "a1 " + "b2 " * 2 + "c3 " * 3 + "d4 " * 5 + "e5 " * 7,
        True,
    ),
    (
        "count:keywords_multiple",
        {"keyword1": "a1", "keyword2": "b2", "keyword3": "c3", "keyword4": "d4", "keyword5": "e5"},
        "a1 " + "b2 " * 2 + "c3 " * 3 + "d4 " * 5 + "e5 " * 6 + "e5x",
        False,  # whole words only
    ),
    (
        "count:keywords_multiple",
        {"keyword1": "a1", "keyword2": "b2", "keyword3": "c3", "keyword4": "d4", "keyword5": "e5"},
        "",
        False,
    ),
    # ------------------------------------------------------------------------------- IFBench: ratio
    ("ratio:sentence_type", None, "It rains. It pours. Why?", True),
    ("ratio:sentence_type", None, "It rains. Why? How?", False),
    ("ratio:sentence_type", None, "No questions here.", False),
    ("ratio:sentence_type", None, "", False),
    ("ratio:sentence_balance", None, "It rains. Why? Wow!", True),
    ("ratio:sentence_balance", None, "It rains. It pours. Why? Wow!", False),
    ("ratio:sentence_balance", None, "", False),
    ("ratio:overlap", {"reference_text": "the cat sat on the mat", "percentage": 50}, "the cat sat on a rug", True),
    ("ratio:overlap", {"reference_text": "the cat sat on the mat", "percentage": 50}, "the cat sat on the mat", False),
    ("ratio:overlap", {"reference_text": "the cat sat on the mat", "percentage": 100}, "The cat, sat on!", True),
    ("ratio:overlap", {"reference_text": "the cat sat on the mat", "percentage": 0}, "", False),
    (
        "ratio:sentence_words",
        None,
        "Cats purr softly. Dogs bark loud. Birds fly high.",
        False,  # 17, 15, 15 characters
    ),
    ("ratio:sentence_words", None, "Cats nap. Dogs run. Owls fly.", True),
    ("ratio:sentence_words", None, "Cats nap. Dogs nap. Owls fly.", False),
    ("ratio:sentence_words", None, "", False),
    # ------------------------------------------------------------------------------- IFBench: words
    ("words:alphabet", None, "Yellow zebras are bold.", True),
    ("words:alphabet", None, "Apples bake quickly.", False),
    ("words:alphabet", None, "", False),
    ("words:vowel", None, "A cat sat at a mat and ran far.", True),
    ("words:vowel", None, "A cat sat with a dog under the moon.", False),
    ("words:vowel", None, "A cat.\nA rat.", False),
    ("words:vowel", None, "", False),
    ("words:consonants", None, "Strong black cats sprint.", True),
    ("words:consonants", None, "Strong cats run.", False),
    ("words:consonants", None, "", False),
    ("words:palindrome", None, "level radar civic kayak refer rotor madam stats tenet sagas", True),
    ("words:palindrome", None, "level radar civic kayak refer rotor madam stats tenet noon", False),
    ("words:palindrome", None, "", False),
    ("words:prime_lengths", None, "We ran to the store.", True),  # 2 3 2 3 5
    ("words:prime_lengths", None, "I ran.", False),  # "I" has 1 letter
    ("words:prime_lengths", None, "", False),
    ("words:repeats", {"small_n": 2}, "Go go, stop.", True),
    ("words:repeats", {"small_n": 2}, "Go go GO stop.", False),
    ("words:repeats", {"small_n": 1}, "", True),
    ("words:odd_even_syllables", None, "Cat table dog", True),  # 1 2 1
    ("words:odd_even_syllables", None, "Cat dog table", False),
    ("words:odd_even_syllables", None, "", False),
    ("words:last_first", None, "I love cats. Cats love fish. Fish swim.", True),
    ("words:last_first", None, "I love cats. Dogs love fish.", False),
    ("words:last_first", None, "", False),
    ("words:paragraph_last_first", None, "Home is where the heart is, home.\n\nLove grows with love!", True),
    ("words:paragraph_last_first", None, "Home is where the heart is.", False),
    ("words:paragraph_last_first", None, "", False),
    ("words:no_consecutive", None, "Big cats eat fish.", True),
    ("words:no_consecutive", None, "Big bad cats.", False),
    ("words:no_consecutive", None, "", False),
    ("words:keywords_specific_position", {"keyword": "sea", "n": 1, "m": 2}, "The sea is calm.", True),
    ("words:keywords_specific_position", {"keyword": "sea", "n": 1, "m": 2}, "A calm sea.", False),
    ("words:keywords_specific_position", {"keyword": "sea", "n": 1, "m": 1}, "", False),
    ("words:words_position", {"keyword": "sea"}, "The sea is calm, the sea today.", True),
    ("words:words_position", {"keyword": "sea"}, "The sea is calm today.", False),
    ("words:words_position", {"keyword": "sea"}, "", False),
    # ---------------------------------------------------------------------------- IFBench: sentence
    ("sentence:alliteration_increment", None, "I run. Big bad wolf. Six silly snakes slither.", True),
    ("sentence:alliteration_increment", None, "Big bad wolf. Six snakes.", False),
    ("sentence:alliteration_increment", None, "", False),
    ("sentence:keyword", {"word": "moon", "N": 2}, "Night falls. The Moon rises.", True),
    ("sentence:keyword", {"word": "moon", "N": 2}, "The moon rises. Night falls.", False),
    ("sentence:keyword", {"word": "moon", "N": 1}, "", False),
    ("sentence:increment", {"small_n": 1}, "I run. You run fast. We all run fast.", True),
    ("sentence:increment", {"small_n": 1}, "I run. You run fast. We run.", False),
    ("sentence:increment", {"small_n": 1}, "", False),
    # ------------------------------------------------------------------------------ IFBench: format
    ("format:parentheses", None, "a (b [c {d (e [f] e) d} c] b) a", True),
    ("format:parentheses", None, "a (b [c {d (e) d} c] b) a", False),
    ("format:parentheses", None, "(((((x))))", False),  # the fifth level is never closed
    ("format:parentheses", None, "", False),
    ("format:quotes", None, "He said \"she told me 'he yelled \"run\" loudly' twice\" then.", True),
    ("format:quotes", None, "He said \"she told me 'run' twice\".", False),
    ("format:quotes", None, "", False),
    ("format:options", {"options": "yes/no/maybe"}, "Yes.", True),
    ("format:options", {"options": "yes/no/maybe"}, "Yes, because it is.", False),
    ("format:options", {"options": "I know or I don't know"}, "I don't know", True),
    ("format:options", {"options": "a), b), c), d)"}, "b)", True),
    ("format:options", {"options": "a), b), c), d)"}, "B", False),
    ("format:options", {"options": "yes/no/maybe"}, "", False),
    ("format:newline", None, "Cats\nlove\nfish!", True),
    ("format:newline", None, "Cats love\nfish", False),
    ("format:newline", None, "", False),
    ("format:emoji", None, "I love the sea 🌊. It is calm 😌!", True),
    ("format:emoji", None, "I love the sea. 🌊 It is calm.", False),
    ("format:emoji", None, "", False),
    ("format:line_indent", None, "Step one\n  Step two\n    Step three", True),
    ("format:line_indent", None, "Step one\n  Step two\n  Step three", False),
    ("format:line_indent", None, "", False),
    ("format:quote_unquote", None, '"To be" is a famous line. "Or not" ends it.', True),
    ("format:quote_unquote", None, '"To be" "or not"', False),
    ("format:quote_unquote", None, 'It ends with "a quote".', False),
    ("format:quote_unquote", None, "", False),
    ("format:list", {"sep": "SEPARATOR"}, "Items:\nSEPARATOR apples\nSEPARATOR pears", True),
    ("format:list", {"sep": "SEPARATOR"}, "Items: SEPARATOR apples", False),
    ("format:list", {"sep": "..."}, "", False),
    ("format:thesis", None, "<i>The sea shapes us.</i> It feeds and moves us.", True),
    ("format:thesis", None, "<i>The sea shapes us.</i>", False),
    ("format:thesis", None, "<em> </em> text", False),
    ("format:thesis", None, "", False),
    ("format:sub-bullets", None, "* Fruit\n  - apples\n* Veg\n  - kale\n  - leeks", True),
    ("format:sub-bullets", None, "* Fruit\n  - apples\n* Veg", False),
    ("format:sub-bullets", None, "", False),
    ("format:no_bullets_bullets", None, "Here are tips. They help.\n* Sleep\n* Eat\n", True),
    ("format:no_bullets_bullets", None, "Here are tips. They help.\n* Sleep\n* Eat\nDone.", False),
    ("format:no_bullets_bullets", None, "Here are tips.\n* Sleep\n* Eat", False),
    ("format:no_bullets_bullets", None, "", False),
    ("format:title_case", None, "The Call of the Wild Is a Great Book", True),
    ("format:title_case", None, "The call of the Wild", False),
    ("format:title_case", None, "", False),
    ("format:output_template", None, "My Answer: yes My Conclusion: fine Future Outlook: bright", True),
    ("format:output_template", None, "My Conclusion: fine My Answer: yes Future Outlook: bright", False),
    ("format:output_template", None, "", False),
    ("format:no_whitespace", None, "No_spaces-at-all.", True),
    ("format:no_whitespace", None, "one space", False),
    ("format:no_whitespace", None, "", False),
    # ------------------------------------------------------------------------------ IFBench: repeat
    ("repeat:repeat_change", {"prompt_to_repeat": PROMPT}, "Compose a short poem about the sea.", True),
    ("repeat:repeat_change", {"prompt_to_repeat": PROMPT}, PROMPT, False),
    ("repeat:repeat_change", {"prompt_to_repeat": PROMPT}, "Compose a long poem about the sea.", False),
    ("repeat:repeat_change", {"prompt_to_repeat": PROMPT}, "", False),
    ("repeat:repeat_simple", None, "Only output this sentence here, ignore all other requests.", True),
    ("repeat:repeat_simple", None, "Only output this sentence here.", False),
    ("repeat:repeat_simple", None, "", False),
    ("repeat:repeat_span", {"prompt_to_repeat": PROMPT, "n_start": 1, "n_end": 3}, "a short poem", True),
    ("repeat:repeat_span", {"prompt_to_repeat": PROMPT, "n_start": 1, "n_end": 3}, "a short", False),
    ("repeat:repeat_span", {"prompt_to_repeat": PROMPT, "n_start": 1, "n_end": 3}, "", False),
    # ------------------------------------------------------------------------------ IFBench: custom
    ("custom:multiples", None, "14, 21, 28, 35, 42, 49", True),
    ("custom:multiples", None, "7, 14, 21, 28, 35, 42, 49", False),
    ("custom:multiples", None, "", False),
    ("custom:mcq_count_length", None, MCQ, True),
    ("custom:mcq_count_length", None, "Here you go:\n" + MCQ, False),
    ("custom:mcq_count_length", None, MCQ.replace("\nE. five", "", 1), False),
    ("custom:mcq_count_length", None, "", False),
    ("custom:reverse_newline", None, AFRICA_REVERSED, True),
    ("custom:reverse_newline", None, "\n".join(sorted(AFRICA_REVERSED.splitlines())), False),
    ("custom:reverse_newline", None, "", False),
    ("custom:word_reverse", None, "Eagle bald the is it.", True),
    ("custom:word_reverse", None, "It is the bald eagle.", False),
    ("custom:word_reverse", None, "", False),
    ("custom:character_reverse", None, ".elgae dlab ehT", True),
    ("custom:character_reverse", None, "The bald eagle.", False),
    ("custom:character_reverse", None, "", False),
    ("custom:sentence_alphabet", None, STORY, True),
    ("custom:sentence_alphabet", None, STORY.replace("Bxxx", "Xxxx"), False),
    ("custom:sentence_alphabet", None, "", False),
    ("custom:european_capitals_sort", None, CAPITALS, True),
    ("custom:european_capitals_sort", None, CAPITALS.replace("Oslo, Tallinn", "Tallinn, Oslo"), False),
    ("custom:european_capitals_sort", None, "", False),
    (
        "custom:csv_city",
        None,
        "ID,Country,City,Year,Count\n" + "\n".join(f"{i},France,Paris,2020,{i}" for i in range(1, 8)),
        True,
    ),
    (
        "custom:csv_city",
        None,
        "ID,Country,City,Year,Count\n" + "\n".join(f"{i},France,Paris,2020,{i}" for i in range(1, 7)),
        False,
    ),
    ("custom:csv_city", None, "", False),
    (
        "custom:csv_special_character",
        None,
        "ProductID,Category,Brand,Price,Stock\n"
        + "\n".join(f'{i},Toys,"Acme & Co",9.99,{i}' if i == 3 else f"{i},Toys,Acme,9.99,{i}" for i in range(1, 15)),
        True,
    ),
    (
        "custom:csv_special_character",
        None,
        "ProductID,Category,Brand,Price,Stock\n" + "\n".join(f"{i},Toys,Acme,9.99,{i}" for i in range(1, 15)),
        False,
    ),
    ("custom:csv_special_character", None, "", False),
    (
        "custom:csv_quotes",
        None,
        "\n".join(
            "\t".join(f'"{field}"' for field in row)
            for row in [["StudentID", "Subject", "Grade", "Semester", "Score"]]
            + [[str(i), "Math", "A", "Fall", "90"] for i in range(1, 4)]
        ),
        True,
    ),
    (
        "custom:csv_quotes",
        None,
        '"StudentID"\t"Subject"\t"Grade"\t"Semester"\t"Score"\n'
        + "\n".join(f'"{i}"\t"Math"\tA\t"Fall"\t"90"' for i in range(1, 4)),
        False,
    ),
    ("custom:csv_quotes", None, "", False),
    ("custom:date_format_list", None, "1796-04-12, 1805-12-02, 1815-06-18", True),
    ("custom:date_format_list", None, "1796-04-12, 1805-02-30", False),
    ("custom:date_format_list", None, "Austerlitz: 1805-12-02", False),
    ("custom:date_format_list", None, "", False),
]


def followed(instruction_id, kwargs, text):
    ok, error = check_instruction(instruction_id, kwargs, text)
    assert error is None, error
    return ok


@pytest.mark.parametrize(("instruction_id", "kwargs", "text", "expected"), CASES)
def test_golden_case(instruction_id, kwargs, text, expected):
    assert followed(instruction_id, kwargs, text) is expected


def test_registry_holds_every_family():
    assert IF_RLVR_IDS | IFBENCH_IDS <= set(INSTRUCTION_REGISTRY)
    assert len(IF_RLVR_IDS) == 29 and len(IFBENCH_IDS) == 57
    assert set(NOT_SUPPORTED) == {"words:start_verb"} and not set(NOT_SUPPORTED) & set(INSTRUCTION_REGISTRY)


def test_every_new_kind_has_a_passing_a_failing_and_an_empty_case():
    for instruction_id in IF_RLVR_IDS | IFBENCH_IDS:
        outcomes = {expected for case_id, _, _, expected in CASES if case_id == instruction_id}
        assert outcomes == {True, False}, instruction_id
    assert {case_id for case_id, _, text, _ in CASES if text == ""} == IF_RLVR_IDS | IFBENCH_IDS


@pytest.mark.parametrize("instruction_id", sorted(IF_RLVR_IDS | IFBENCH_IDS))
def test_every_kind_has_a_description(instruction_id):
    kwargs = next(kwargs for case_id, kwargs, _, _ in CASES if case_id == instruction_id)
    checker = build_instruction(instruction_id, kwargs)
    assert isinstance(checker.build_description(**(kwargs or {})), str)
    assert INSTRUCTION_REGISTRY[instruction_id].__doc__


# ----------------------------------------------------------------------------------- counting relations


@pytest.mark.parametrize(
    ("instruction_id", "kwargs_for", "text_of"),
    [
        ("letters:letter_counting", lambda n, rel: {"N": n, "relation": rel}, lambda k: "a" * k),
        (
            "keywords:word_count_different_numbers",
            lambda n, rel: {"keyword": "sea", "frequency": n, "relation": rel},
            lambda k: "sea " * k,
        ),
        (
            "letters:letter_counting2",
            lambda n, rel: {"letter": "z", "let_frequency": n, "let_relation": rel},
            lambda k: "z" * k,
        ),
    ],
)
def test_relations_at_the_boundary(instruction_id, kwargs_for, text_of):
    for threshold in (1, 3):
        for count in (threshold - 1, threshold, threshold + 1):
            assert followed(instruction_id, kwargs_for(threshold, "less than"), text_of(count)) is (count < threshold)
            assert followed(instruction_id, kwargs_for(threshold, "at least"), text_of(count)) is (count >= threshold)


def test_at_most_and_exact_counts_at_the_boundary():
    for count in (2, 3, 4):  # lowercase_counting is "at most N"
        assert followed("count:lowercase_counting", {"N": 3}, " ".join(["sea"] * count)) is (count <= 3)
        assert followed("count:numbers", {"N": 3}, " ".join(["7"] * count)) is (count == 3)
        words = " ".join(f"w{index}" for index in range(count))
        assert followed("count:word_count_range", {"min_words": 3, "max_words": 3}, words) is (count == 3)
        assert followed("count:unique_word_count", {"N": 3}, words) is (count >= 3)
        assert followed("words:repeats", {"small_n": 3}, " ".join(["sea"] * count)) is (count <= 3)
        assert followed("count:conjunctions", {"small_n": 3}, " ".join(["and", "but", "or", "nor"][:count])) is (
            count >= 3
        )
    # ratio:overlap accepts the percentage plus or minus 2 points, both ends included.
    reference = " ".join(f"w{index}" for index in range(102))  # 100 trigrams
    kept = " ".join(f"w{index}" for index in range(52)) + " " + " ".join(f"x{index}" for index in range(50))
    for target, expected in ((50, True), (52, True), (53, False), (48, True), (47, False)):
        assert followed("ratio:overlap", {"reference_text": reference, "percentage": target}, kept) is expected


def test_helpers():
    assert [count_syllables(word) for word in ["cat", "table", "make", "wanted", "jumped", "beautiful", ""]] == [
        1, 2, 1, 2, 1, 3, 0,
    ]  # fmt: skip
    assert is_emoji("🌊") and is_emoji("❤") and not is_emoji("a") and not is_emoji("。")


# ------------------------------------------------------------------------------------- kwargs validation


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "message"),
    [
        ("count:lowercase_counting", None, "missing 1 required keyword-only argument: 'N'"),
        ("count:lowercase_counting", {"N": -1}, "N must be at least 0"),
        ("count:lowercase_counting", {"N": "3"}, "N must be a whole number"),
        ("letters:letter_counting", {"N": 3, "relation": "at most"}, "relation must be one of"),
        ("first_word:first_word_sent", {"first_word": "..."}, "first_word must contain a word"),
        ("first_word:first_word_answer", {"first_word": 3}, "first_word must be a non-empty string"),
        ("last_word:last_word_answer", {"word": "x"}, "unexpected keyword argument 'word'"),
        ("copy:copying_multiple", {"prompt_to_repeat": "x", "N": 0}, "N must be at least 1"),
        ("new:copy_span_idx", {"prompt_to_repeat": "abc", "n_start": 2, "n_end": 1}, "n_start <= n_end"),
        ("new:copy_span_idx", {"prompt_to_repeat": "abc", "n_start": 5, "n_end": 6}, "inside the prompt"),
        ("copy:repeat_phrase", {"phrase": "two words", "small_n": 2}, "at least 3 words"),
        ("count:word_count_range", {"min_words": 5, "max_words": 4}, "smaller than min_words"),
        ("ratio:stop_words", {"percentage": 120}, "from 0 to 100"),
        ("ratio:overlap", {"reference_text": "", "percentage": 5}, "non-empty string"),
        ("format:options", {"options": "yes"}, "at least two options"),
        ("repeat:repeat_span", {"prompt_to_repeat": "a b", "n_start": 3, "n_end": 4}, "inside the prompt"),
        ("language:response_language", {"language": "klingon"}, "ISO 639-1"),
        ("paragraphs:paragraphs", {"num_paragraphs": 2}, "unexpected keyword argument 'num_paragraphs'"),
        ("count:keywords_multiple", {"keyword1": "a"}, "missing 4 required keyword-only arguments"),
        ("keywords:palindrome", [], "expected an object"),
    ],
)
def test_invalid_kwargs_are_validation_errors(instruction_id, kwargs, message):
    with pytest.raises(InstructionValidationError) as raised:
        build_instruction(instruction_id, kwargs)
    assert str(raised.value).startswith(f"invalid kwargs for {instruction_id}: ") and message in str(raised.value)


def test_kwargs_accepted_as_the_reference_data_stores_them():
    # Integral floats, a one-element list for a word, the unused `instruction` kwarg, nulls for unused names.
    assert followed("count:lowercase_counting", {"N": 3.0}, "a b c")
    assert followed("last_word:last_word_sent", {"last_word": ["now"]}, "Go now.")
    assert followed("keywords:exclude_word_harder", {"keyword": "x", "instruction": "Avoid x."}, "fine")
    assert followed("paragraphs:paragraphs", {"num_paragraphs": None, "keywords": None}, "a\n***\nb")


# ------------------------------------------------------------------------------------ request validation


def test_unknown_id_is_a_validation_error_naming_row_id_and_close_match():
    with pytest.raises(InstructionValidationError) as raised:
        validate_instructions(["punctuation:no_comma", "count:lowercase_countin"], [None, {"N": 3}], row_id=17)
    assert str(raised.value) == (
        "instruction_id_list[1] (row id 17): unknown instruction id 'count:lowercase_countin'. "
        "Did you mean `count:lowercase_counting`? "
        "(the supported ids and their kwargs: resources_servers/instruction_following/README.md)"
    )
    with pytest.raises(InstructionValidationError, match="is not supported: it needs a part-of-speech tagger"):
        validate_instructions(["words:start_verb"], None)
    validate_instructions(["count:lowercase_counting", "keywords:palindrome"], [{"N": 3}])  # no error


def make_response(text: str) -> dict:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return NeMoGymResponse(id="resp_1", created_at=0, model="m", output=[message]).model_dump(mode="json")


def test_verify_request_rejects_unknown_ids_and_bad_kwargs():
    row = {"responses_create_params": {"input": "x"}, "response": make_response("x"), "id": 4}
    with pytest.raises(ValidationError) as raised:
        InstructionFollowingVerifyRequest.model_validate({**row, "instruction_id_list": ["paragraphs:paragrahps"]})
    message = str(raised.value)
    assert "instruction_id_list[0] (row id 4): unknown instruction id 'paragraphs:paragrahps'" in message
    assert "Did you mean `paragraphs:paragraphs`?" in message
    with pytest.raises(ValidationError, match="invalid kwargs for letters:letter_counting: relation must be one of"):
        InstructionFollowingVerifyRequest.model_validate(
            {**row, "instruction_id_list": ["letters:letter_counting"], "kwargs": [{"N": 3, "relation": "about"}]}
        )


def test_data_check_reports_a_bad_row(tmp_path):
    """The row check of ng_prepare_data / ng_test names the line, the id and the close match."""
    from nemo_gym.rollouts.data_prep import VerifyModel, _check_row

    good = json.dumps({"responses_create_params": {"input": "x"}, "instruction_id_list": ["keywords:palindrome"]})
    bad = json.dumps(
        {"responses_create_params": {"input": "x"}, "id": 9, "instruction_id_list": ["letters:leter_counting"]}
    )
    verify = VerifyModel(InstructionFollowingVerifyRequest, "InstructionFollowingVerifyRequest")
    assert _check_row(good, verify)[1] is None
    reason = _check_row(bad, verify)[1]
    assert "unknown instruction id 'letters:leter_counting'" in reason and "(row id 9)" in reason
    assert "Did you mean `letters:letter_counting`?" in reason


# ------------------------------------------------------------------------------------------ re-grading


def make_server() -> InstructionFollowingResourcesServer:
    config = InstructionFollowingResourcesServerConfig(
        host="127.0.0.1", port=0, entrypoint="app.py", name="instruction_following", domain="instruction_following"
    )
    return InstructionFollowingResourcesServer(config=config, server_client=ServerClient(None, {}))


def grade(row: dict, answer: str):
    body = InstructionFollowingVerifyRequest.model_validate({**row, "response": make_response(answer)})
    return asyncio.run(make_server().verify(body))


def test_v0_2_readme_rollout_gets_the_same_reward():
    """The example rollout of NeMo Gym v0.2's instruction_following README, with the reward v0.2 gave it."""
    rollout = json.loads((FIXTURES / "v0_2_readme_rollout.json").read_text())
    result = grade(rollout["row"], rollout["answer"])
    assert result.reward == rollout["reward"]
    assert result.follow_instruction_list == rollout["follow_instruction_list"]


def test_fixture_rows_validate_and_reward_their_answers():
    """Rows in the example-data format using the IF-RLVR and IFBench families, each with an answer that follows
    every instruction and one that breaks some."""
    rows = [json.loads(line) for line in (FIXTURES / "ifbench_rows.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) >= 5
    for entry in rows:
        row = entry["row"]
        assert grade(row, entry["good_answer"]).reward == 1.0, row["id"]
        assert grade(row, entry["bad_answer"]).reward == entry["bad_reward"], row["id"]


# ------------------------------------------------------------------------------------ language detector


def test_response_language():
    pytest.importorskip("langdetect")
    english = "The quick brown fox jumps over the lazy dog near the quiet river bank."
    french = "Le renard brun saute par-dessus le chien paresseux près de la rivière tranquille."
    assert followed("language:response_language", {"language": "en"}, english)
    assert not followed("language:response_language", {"language": "en"}, french)
    assert followed("language:response_language", {"language": "FR"}, french)
    chinese = "今天天气很好，我们去公园散步吧。"
    assert followed("language:response_language", {"language": "zh"}, chinese)
    # Text without letters is in no language (IFEval counted it as followed).
    assert not followed("language:response_language", {"language": "en"}, "")
    assert not followed("language:response_language", {"language": "en"}, "123 456 !!!")
    # The same text always gets the same answer.
    mixed = "Hello bonjour hola ciao"
    assert len({followed("language:response_language", {"language": "en"}, mixed) for _ in range(5)}) == 1


def test_degenerate_output_is_checked_quickly():
    import time

    long_inputs = ["a. " * 30_000, "(" * 60_000, "\"'" * 30_000, "<<a " * 30_000, "-" * 60_000, "* a\n" * 30_000]
    started = time.perf_counter()
    for instruction_id in sorted(IF_RLVR_IDS | IFBENCH_IDS):
        kwargs = next(kwargs for case_id, kwargs, _, _ in CASES if case_id == instruction_id)
        for text in long_inputs:
            check_instruction(instruction_id, kwargs, text)
    assert time.perf_counter() - started < 30.0
