"""Write the multiple_choice benchmark: four-option questions about numbers, generated with a seeded random
generator (offline). Each row carries its own prompt (the options are part of it) and the mcqa grading fields."""

from __future__ import annotations

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent / "data" / "multiple_choice_benchmark.jsonl"
LETTERS = "ABCD"
PRIMES = [p for p in range(11, 98) if all(p % d for d in range(2, int(p**0.5) + 1))]
COMPOSITES = [n for n in range(12, 99) if n not in PRIMES]


def _largest(rng: random.Random) -> tuple[str, int, list[int]]:
    options = rng.sample(range(100, 1000), 4)
    return "Which of these numbers is the largest?", max(options), options


def _prime(rng: random.Random) -> tuple[str, int, list[int]]:
    answer = rng.choice(PRIMES)
    return "Which of these numbers is prime?", answer, [answer, *rng.sample(COMPOSITES, 3)]


def _product(rng: random.Random) -> tuple[str, int, list[int]]:
    a, b = rng.randint(3, 12), rng.randint(3, 12)
    answer = a * b
    wrong = rng.sample([answer + d for d in (-a, -b, a, b, 1, -1, 10) if answer + d > 0 and d != 0], 3)
    return f"What is {a} times {b}?", answer, [answer, *dict.fromkeys(wrong)]


def _remainder(rng: random.Random) -> tuple[str, int, list[int]]:
    divisor = rng.randint(4, 9)
    number = rng.randint(20, 99)
    answer = number % divisor
    others = [r for r in range(divisor) if r != answer]
    return f"What is the remainder when {number} is divided by {divisor}?", answer, [answer, *rng.sample(others, 3)]


_MAKERS = (_largest, _prime, _product, _remainder)


def _row(rng: random.Random, index: int) -> dict:
    while True:
        question, answer, options = _MAKERS[index % len(_MAKERS)](rng)
        if len(set(options)) == 4:
            break
    rng.shuffle(options)
    letter = LETTERS[options.index(answer)]
    listed = "\n".join(f"{LETTERS[i]}) {value}" for i, value in enumerate(options))
    prompt = (
        f"{question}\n\n{listed}\n\n"
        "Think briefly, then give only the letter of your choice as \\boxed{X}."
    )
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "options": [{LETTERS[i]: str(value)} for i, value in enumerate(options)],
        "expected_answer": letter,
        "grading_mode": "strict_single_letter_boxed",
        "uuid": f"multiple_choice-{index}",
    }


def prepare(num_rows: int = 30, seed: int = 7) -> str:
    """Write `num_rows` questions (cycling over the question kinds) and return the file's path."""
    rng = random.Random(seed)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    with OUTPUT.open("w", encoding="utf-8") as out:
        for index in range(num_rows):
            out.write(json.dumps(_row(rng, index)) + "\n")
    return str(OUTPUT)
