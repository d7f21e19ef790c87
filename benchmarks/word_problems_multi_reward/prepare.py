"""Write the word_problems_multi_reward benchmark: two-step word problems from templates and a seeded random
generator (offline). Rows hold `question`, `expected_answer` (an integer) and `max_words`; the prompt is the
dataset's `prompt_config`."""

from __future__ import annotations

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent / "data" / "word_problems_multi_reward_benchmark.jsonl"

_PROBLEMS = (
    (lambda a, b, c: f"A library has {a} shelves with {b} books each, and {c} more books on a cart. How many books "
     "does it have?", lambda a, b, c: a * b + c),
    (lambda a, b, c: f"Tom buys {a} packs of {b} cards and gives away {c} cards. How many cards does he have left?",
     lambda a, b, c: a * b - c),
    (lambda a, b, c: f"A train has {a} cars. Each car has {b} rows of {c} seats. How many seats does the train have?",
     lambda a, b, c: a * b * c),
    (lambda a, b, c: f"Sara reads {a} pages on Monday, twice as many on Tuesday and {c} pages on Wednesday. How many "
     "pages does she read in total?", lambda a, b, c: 3 * a + c),
)


def prepare(num_rows: int = 24, seed: int = 42) -> str:
    """Write `num_rows` problems (cycling over the templates) and return the file's path."""
    rng = random.Random(seed)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    with OUTPUT.open("w", encoding="utf-8") as out:
        for index in range(num_rows):
            question, answer = _PROBLEMS[index % len(_PROBLEMS)]
            a, b, c = rng.randint(2, 9), rng.randint(3, 12), rng.randint(1, 9)
            row = {"question": question(a, b, c), "expected_answer": answer(a, b, c), "max_words": 40}
            out.write(json.dumps(row) + "\n")
    return str(OUTPUT)
