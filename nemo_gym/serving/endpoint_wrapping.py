"""Wrapping a route handler so FastAPI still sees the handler's own parameters.

`functools.wraps` alone is not enough: FastAPI reads the wrapper's signature, and a handler written with
`from __future__ import annotations` has string annotations that older FastAPI (0.115) resolves in the
*wrapper's* module, where the handler's body model is unknown: the body then silently turns into a required query
parameter (a 422 on every call). So the wrapper gets the handler's signature with its annotations already
evaluated in the handler's own module.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

__all__ = ["wraps_endpoint"]

F = TypeVar("F", bound=Callable[..., Any])


def resolved_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """`fn`'s signature with string annotations evaluated in `fn`'s module (as written, if that fails)."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # an annotation that only type checkers can resolve: FastAPI will say what it makes of it
        return inspect.signature(fn)


def wraps_endpoint(handler: Callable[..., Any]) -> Callable[[F], F]:
    """`functools.wraps(handler)` plus `handler`'s resolved signature on the wrapper."""

    def decorate(wrapper: F) -> F:
        wrapped = functools.wraps(handler)(wrapper)
        wrapped.__signature__ = resolved_signature(handler)  # type: ignore[attr-defined]
        return wrapped

    return decorate
