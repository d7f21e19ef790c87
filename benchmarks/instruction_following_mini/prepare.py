"""Write the instruction_following_mini benchmark: a writing task plus two or three verifiable instructions, drawn
with a seeded random generator (offline), in the row format of the instruction_following resources server."""

from __future__ import annotations

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent / "data" / "instruction_following_mini_benchmark.jsonl"

TASKS = (
    "Describe a walk through a pine forest after rain.",
    "Explain to a child why the moon changes shape.",
    "Write a short note inviting a neighbour to a garden party.",
    "Give advice to someone learning to ride a bicycle.",
    "Describe your ideal breakfast.",
    "Explain how to make a paper boat.",
    "Write a product description for a reusable water bottle.",
    "Tell a very short story about a lost umbrella.",
    "Summarise why people keep houseplants.",
    "Describe a busy train station in the morning.",
)

# (instruction id, its kwargs or None, the sentence that asks for it). Ids in one group contradict each other, so
# a row takes at most one instruction per group.
INSTRUCTIONS = (
    ("case", "change_case:english_lowercase", None, "Write everything in lowercase letters."),
    ("case", "change_case:english_capital", None, "Write everything in capital letters."),
    ("comma", "punctuation:no_comma", None, "Do not use any commas."),
    ("length", "length_constraints:number_words", {"num_words": 60, "relation": "less than"},
     "Use fewer than 60 words."),
    ("length", "length_constraints:number_words", {"num_words": 30, "relation": "at least"},
     "Use at least 30 words."),
    ("keywords", "keywords:existence", {"keywords": ["blue"]}, "Include the word 'blue'."),
    ("keywords", "keywords:forbidden_words", {"forbidden_words": ["very", "really"]},
     "Do not use the words 'very' or 'really'."),
    ("end", "startend:end_checker", {"end_phrase": "That is all."},
     "End your response with the exact phrase: That is all."),
    ("end", "detectable_content:postscript", {"postscript_marker": "P.S."},
     "At the end, add a postscript starting with P.S."),
    ("format", "detectable_format:number_bullet_lists", {"num_bullets": 3},
     "Format the answer as exactly 3 markdown bullet points (lines starting with '* ')."),
    ("format", "detectable_format:title", None, "Give it a title wrapped in double angular brackets, like <<title>>."),
)


def _row(rng: random.Random, index: int) -> dict:
    task = TASKS[index % len(TASKS)]
    chosen: list[tuple] = []
    groups: set[str] = set()
    wanted = 2 + index % 2  # two or three instructions
    for group, instruction_id, kwargs, sentence in rng.sample(INSTRUCTIONS, len(INSTRUCTIONS)):
        if group in groups:
            continue
        if {group, *groups} >= {"case", "end"}:
            continue  # a whole-text case rule and a mixed-case end phrase or "P.S." cannot both hold
        groups.add(group)
        chosen.append((group, instruction_id, kwargs, sentence))
        if len(chosen) == wanted:
            break
    prompt = " ".join([task, *(c[3] for c in chosen)])
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "id": index,
        "prompt": prompt,
        "instruction_id_list": [c[1] for c in chosen],
        "kwargs": [c[2] for c in chosen],
        "grading_mode": "binary",
    }


def prepare(num_rows: int = 30, seed: int = 5) -> str:
    """Write `num_rows` tasks and return the file's path."""
    rng = random.Random(seed)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    with OUTPUT.open("w", encoding="utf-8") as out:
        for index in range(num_rows):
            out.write(json.dumps(_row(rng, index)) + "\n")
    return str(OUTPUT)
