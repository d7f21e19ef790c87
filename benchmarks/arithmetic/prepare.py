"""Write the arithmetic benchmark: word problems made from templates and a seeded random generator (offline).

Rows hold `question` and `expected_answer` only; the prompt comes from the dataset's `prompt_config`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent / "data" / "arithmetic_benchmark.jsonl"

# (template, answer) makers over random whole numbers; every answer is a whole number.
_PROBLEMS = (
    (lambda a, b, c: f"A farmer packs {a} crates with {b} apples in each crate. How many apples does he pack?",
     lambda a, b, c: a * b),
    (lambda a, b, c: f"Mia has {a + b} stickers and gives {b} of them to her brother. How many stickers does she keep?",
     lambda a, b, c: a),
    (lambda a, b, c: f"A bus carries {a} people. At the first stop {b} more get on, and at the second stop {c} more "
     "get on. How many people are on the bus now?",
     lambda a, b, c: a + b + c),
    (lambda a, b, c: f"{a * b} marbles are shared equally among {b} children. How many marbles does each child get?",
     lambda a, b, c: a),
    (lambda a, b, c: f"A notebook costs {a} dollars and a pen costs {b} dollars. How much do {c} notebooks and one pen "
     "cost together, in dollars?",
     lambda a, b, c: a * c + b),
    (lambda a, b, c: f"What is {a} + {b} * {c}?", lambda a, b, c: a + b * c),
)


def prepare(num_rows: int = 30, seed: int = 2024) -> str:
    """Write `num_rows` problems (cycling over the templates) and return the file's path."""
    rng = random.Random(seed)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    with OUTPUT.open("w", encoding="utf-8") as out:
        for index in range(num_rows):
            question, answer = _PROBLEMS[index % len(_PROBLEMS)]
            a, b, c = rng.randint(2, 12), rng.randint(2, 9), rng.randint(2, 6)
            row = {"question": question(a, b, c), "expected_answer": str(answer(a, b, c))}
            out.write(json.dumps(row) + "\n")
    return str(OUTPUT)
