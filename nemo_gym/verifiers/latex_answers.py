"""Reading LaTeX-style answers (`\\boxed{...}`, `\\text{...}`) out of model text, for verifiers.

Braces are paired in one pass over the text, so degenerate output (thousands of unclosed `\\boxed{`) costs linear
time instead of a rescan per box.
"""

from __future__ import annotations

from typing import Iterator, Optional

__all__ = ["brace_pairs", "boxed_contents"]

_BOXED = "\\boxed{"


def brace_pairs(text: str) -> dict[int, int]:
    """Index of each `{` that is closed -> index of the `}` that closes it (a `}` with nothing open is ignored)."""
    closing: dict[int, int] = {}
    open_braces: list[int] = []
    for pos, char in enumerate(text):
        if char == "{":
            open_braces.append(pos)
        elif char == "}" and open_braces:
            closing[open_braces.pop()] = pos
    return closing


def boxed_contents(text: str) -> Iterator[Optional[str]]:
    """The content of each `\\boxed{...}` in order, nested braces balanced (`\\boxed{\\frac{1}{2}}` ->
    `\\frac{1}{2}`), not stripped; None for a box that is never closed. The search goes on after a closed box's
    end (boxes inside it are not read) and right after an unclosed box's `{`."""
    closing = brace_pairs(text)
    start = 0
    while (found := text.find(_BOXED, start)) != -1:
        open_pos = found + len(_BOXED) - 1
        close_pos = closing.get(open_pos)
        if close_pos is None:
            yield None
            start = open_pos
        else:
            yield text[open_pos + 1 : close_pos]
            start = close_pos + 1
