"""The 5 examples through a real stack (ng_run + ng_collect_rollouts) with scripted answers: some follow every
instruction, some break one, and the fraction rows show partial credit."""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.script import answer_rule


def answer(name: str, prompt_part: str, text: str) -> dict:
    return answer_rule(prompt_part, text, name=name)


SCRIPT = [
    # id 0, binary: lowercase, no commas, fewer than 40 words -> all followed.
    answer(
        "sunrise",
        "sunrise over the sea",
        "the sky turns from grey to pink as the sun lifts out of the water. gulls wheel over the waves and the "
        "whole bay glows gold for a few quiet minutes.",
    ),
    # id 1, binary: title and 3 bullets, but no postscript -> 0.0.
    answer(
        "houseplants",
        "houseplants",
        "<<Happy Houseplants>>\n\n* Water only when the top of the soil feels dry.\n"
        "* Give each plant the light its label asks for.\n* Wipe dust off the leaves every few weeks.\n\n"
        "Enjoy your green corner!",
    ),
    # id 2, fraction: keywords present and the end phrase, but a forbidden word ("lost") -> 2/3.
    answer(
        "hiker",
        "first-time hiker",
        "Pack a compass and more water than you think you need, tell someone your route, and turn back early "
        "if the weather changes so you never get lost. Is there anything else I can help with?",
    ),
    # id 3, binary: fenced JSON with "zebra" twice -> 1.0.
    answer(
        "zebras",
        "facts about zebras",
        '```json\n{"fact_1": "Every zebra has a unique stripe pattern.", '
        '"fact_2": "A group of zebras is called a dazzle."}\n```',
    ),
    # id 4, fraction: starts right, 2 sections, 2 highlights, but 4 capital words (fewer than 4 asked) -> 3/4.
    answer(
        "bread",
        "baking bread",
        "Here is your guide to a first loaf.\n\nSection 1\nMix flour, water, salt and yeast, then knead for "
        "*ten minutes* until the dough is smooth. DO NOT SKIP THIS.\n\nSection 2\nLet it rise, shape it, and "
        "bake at 220 °C until the crust is *deep brown*.",
    ),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("instruction_following", tmp_path, script=SCRIPT)
    assert len(rows) == 5
    assert [row["id"] for row in rows] == [0, 1, 2, 3, 4]
    assert [row["reward"] for row in rows] == [1.0, 0.0, 2 / 3, 1.0, 0.75]
    assert [row["follow_instruction_list"] for row in rows] == [
        [True, True, True],
        [True, True, False],
        [True, False, True],
        [True, True],
        [True, True, True, False],
    ]
    assert [row["follow_all_instructions"] for row in rows] == [True, False, False, True, False]
    for row in rows:
        assert row["instruction_errors"] == [None] * len(row["instruction_id_list"])
        assert row["response"]["output"][-1]["type"] == "message"
        assert row["prompt"] == row["responses_create_params"]["input"][0]["content"]
