"""The math-verify part of math_with_judge, kept apart from the server so a worker process imports only this
(and math-verify) before grading: see `nemo_gym/isolation/worker_pool.py`.

Everything here is the real library: `parse` extracts answers (LaTeX, plain expressions, `\\boxed{}`), `verify`
compares them symbolically and numerically, each guarded by math-verify's own signal-based timeouts (which work
here because a worker runs them in its main thread).
"""

from __future__ import annotations

import logging
from typing import Optional

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# "Timeout during comparison" and extraction warnings are expected on model output: keep server logs readable.
logging.getLogger("math_verify").setLevel(logging.ERROR)

GOLD_EXTRACTION = [LatexExtractionConfig()]
PREDICTION_EXTRACTION = [ExprExtractionConfig(), LatexExtractionConfig()]


class ExpectedAnswerUnreadable(ValueError):
    """The dataset's expected answer is not something math-verify can read (a data problem, not the model's)."""


def strip_math_delimiters(answer: str) -> str:
    """`\\(x\\)` -> `x`, then `$x$` / `$$x$$` -> `x`: the outer math-mode delimiters datasets often keep."""
    answer = answer.strip()
    if len(answer) >= 4 and answer.startswith("\\(") and answer.endswith("\\)"):
        answer = answer[2:-2].strip()
    while len(answer) >= 2 and answer.startswith("$") and answer.endswith("$"):
        answer = answer[1:-1].strip()
    return answer


def grade_with_math_verify(expected_answer: str, text: str) -> tuple[float, Optional[str]]:
    """(library_reward, extracted_answer) for the model's `text`.

    The expected answer, without its outer math delimiters, is wrapped in `\\boxed{}` and read as LaTeX; the
    model's text is read both as a plain expression and as LaTeX. Reward 1.0 iff some extracted prediction equals
    some extracted gold. The extracted answer is the first prediction that matches, else the first one, else None.
    Raises `ExpectedAnswerUnreadable` when nothing can be read from the expected answer.
    """
    golds = parse("\\boxed{" + strip_math_delimiters(expected_answer) + "}", GOLD_EXTRACTION)
    if not golds:
        raise ExpectedAnswerUnreadable(f"math-verify could not read the expected answer {expected_answer!r}")
    predictions = parse(text, PREDICTION_EXTRACTION)
    for prediction in predictions:
        if verify(golds, prediction):
            return 1.0, str(prediction)
    return 0.0, (str(predictions[0]) if predictions else None)
