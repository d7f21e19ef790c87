"""Small assertion helpers shared by the unit tests."""

from __future__ import annotations

from typing import Any, Callable

import pytest

__all__ = ["error_message"]


def error_message(exc_type: type[BaseException], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """The message of the `exc_type` that `fn(*args, **kwargs)` raises; the test fails if it raises none."""
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    return str(info.value)
