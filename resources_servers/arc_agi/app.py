"""arc_agi: ARC-style grid puzzles, scored by exact match of the output grid.

Each row shows a few input/output grid pairs that follow one hidden rule and a test input; the model must apply
the rule and answer with the output grid, written as `\\boxed{[[0,1],[1,0]]}`. `verify` parses the grid from the
assistant's text and compares it cell by cell with `expected_output`.

Parsing: the first `\\boxed{[[...]]}` that holds a valid grid; if the text has no such box at all, the first bare
`[[...]]` that is a valid grid. A valid grid is a non-empty list of lists of integers whose first row is not empty.

What it teaches: tolerant parsing of a structured answer from free text, with `extraction_successful` reported
next to the reward so format failures and wrong answers can be told apart.
"""

import json
import re
from typing import Any, Optional

from fastapi import FastAPI

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)

Grid = list[list[int]]


class ARCAGIResourcesServerConfig(BaseResourcesServerConfig):
    pass


class ARCAGIRunRequest(BaseRunRequest):
    train: list[dict[str, Any]] = []  # the demonstration pairs [{"input": grid, "output": grid}] shown in the prompt
    test_input: Grid = []  # the grid the model transforms (also in the prompt)
    expected_output: Grid  # the answer
    task_id: Optional[str] = None


class ARCAGIVerifyRequest(ARCAGIRunRequest, BaseVerifyRequest):
    pass


class ARCAGIVerifyResponse(ARCAGIVerifyRequest, BaseVerifyResponse):
    predicted_output: Optional[Grid] = None  # the parsed grid, None when nothing could be parsed
    extraction_successful: bool = False


def assistant_text(body: BaseVerifyRequest) -> str:
    """Every `output_text` part of every assistant message, one per line, stripped."""
    return "\n".join(body.response.assistant_texts()).strip()


# A grid-shaped answer is written only with digits, commas, whitespace and brackets. The text is cut into maximal
# runs of those characters (one linear pass), and each run is examined on its own. This finds exactly what the
# pattern `\[\s*\[[\d\s,\[\]]+\]\s*\]` would, without running that pattern: its backtracking takes quadratic
# time on degenerate output such as 30k repetitions of "[[1,", long enough to stall the server.
_RUN = re.compile(r"[\d\s,\[\]]+")
_OPENING = re.compile(r"\[\s*\[")
_BOX_PREFIX = "\\boxed{"


def _last_closing_pair(run: str) -> Optional[tuple[int, int]]:
    """(start, end) of the last `]`, optional whitespace, `]` in the run, or None."""
    pos = len(run) - 1
    while pos >= 0:
        if run[pos] == "]":
            before = pos - 1
            while before >= 0 and run[before].isspace():
                before -= 1
            if before >= 0 and run[before] == "]":
                return before, pos + 1
            pos = before
        else:
            pos -= 1
    return None


def _grid_span(run: str) -> Optional[tuple[int, int]]:
    """Where a grid-shaped answer lies in a run: from the first `[[` to the last `]]`, with something between."""
    opening = _OPENING.search(run)
    closing = _last_closing_pair(run)
    if opening is None or closing is None or closing[0] <= opening.end():
        return None
    return opening.start(), closing[1]


def grid_candidates(text: str) -> list[str]:
    """Grid-shaped substrings: those written as `\\boxed{[[...]]}` if there is any, else every bare `[[...]]`."""
    boxed: list[str] = []
    bare: list[str] = []
    for match in _RUN.finditer(text):
        run = match.group()
        span = _grid_span(run)
        if span is None:
            continue
        bare.append(run[span[0] : span[1]])
        in_box = text.endswith(_BOX_PREFIX, 0, match.start()) and text.startswith("}", match.end())
        if in_box and span == (0, len(run)):  # the grid fills the box exactly
            boxed.append(run)
    return boxed or bare


def as_grid(candidate: str) -> Optional[Grid]:
    """The candidate as a grid, or None if it is not valid JSON for a non-empty list of lists of integers."""
    try:
        value = json.loads(candidate)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(row, list) and all(type(cell) is int for cell in row) for row in value):
        return None
    return value if value[0] else None


def parse_grid(text: str) -> Optional[Grid]:
    """The first candidate that is a valid grid (boxed answers first; bare ones only when nothing is boxed)."""
    for candidate in grid_candidates(text):
        grid = as_grid(candidate)
        if grid is not None:
            return grid
    return None


class ARCAGIResourcesServer(SimpleResourcesServer):
    config: ARCAGIResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        return super().setup_webserver()  # no tools: the answer is in the text

    async def verify(self, body: ARCAGIVerifyRequest) -> ARCAGIVerifyResponse:
        predicted = parse_grid(assistant_text(body))
        reward = 1.0 if predicted is not None and predicted == body.expected_output else 0.0
        return ARCAGIVerifyResponse(
            **body.model_dump(),
            reward=reward,
            predicted_output=predicted,
            extraction_successful=predicted is not None,
        )


if __name__ == "__main__":
    ARCAGIResourcesServer.run_webserver()
