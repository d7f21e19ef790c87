"""Cookie containers that cross between `httpx`, `httpx2` and `http.cookies.SimpleCookie` work as cookies.

Why this exists: starlette's (so FastAPI's) `TestClient` is built on `httpx2` whenever `httpx2` is installed, and
newer `openai` (3.x), `anthropic` and `mcp` releases bring it in. Test code written for NeMo Gym v0.2/v0.5 hands
the test client cookies from the `httpx` world (`httpx.Cookies`, an `httpx.Response`'s `.cookies`) and from
aiohttp-style responses (`SimpleCookie`, as our `ServerResponse.cookies`). `httpx2.Cookies(x)` takes any object that
is not its own `Cookies`, a dict or a list to *be* the cookie jar, so an `httpx.Cookies` becomes a broken jar:
`TestClient(app, cookies=...)`, `client.cookies = ...`, `client.cookies.update(...)` and per-request `cookies=`
fail with AttributeError (`httpx.Cookies` does the same with an `httpx2.Cookies`). A `SimpleCookie` fails in
both, since its values are `Morsel`s, not strings.

Why here and not in the dependency ranges: capping `openai` below 3 does not keep `httpx2` out (anthropic and
mcp need it too) and starlette picks it whenever it is importable; capping starlette would hold FastAPI back. The
framework is what hands these cookies out, so it makes them interoperate.

What `install()` does (idempotent, from `nemo_gym.server_utils` / `nemo_gym.openai_utils` on import): it wraps
`Cookies.__init__` of `httpx` and of `httpx2` so that (1) the other library's `Cookies` is copied cookie by
cookie (both keep stdlib `http.cookiejar.Cookie` objects, so domain, path and flags survive), and (2) a mapping
with `Morsel` values (a `SimpleCookie`) is read as `{name: coded value}`. Everything else goes to the library's
own constructor unchanged. `httpx2` is patched when it is imported (a post-import hook), so importing nemo_gym
does not import it.
"""

from __future__ import annotations

import copy
import functools
import http.cookiejar
import importlib.abc
import importlib.util
import sys
import threading
from http.cookies import Morsel
from typing import Any, Callable, Optional

__all__ = ["install", "foreign_cookies_as_native"]

_MARK = "_nemo_gym_cookie_interop"
_PATCHED_MODULES = ("httpx", "httpx2")
_lock = threading.Lock()


def foreign_cookies_as_native(cookies: Any, native_cls: type) -> Any:
    """What `native_cls(cookies)` should be given instead of `cookies`: a list of `Cookie` copies for another
    library's `Cookies`, a `{name: value}` dict for a mapping of `Morsel`s, else `cookies` itself."""
    if cookies is None or isinstance(cookies, native_cls):
        return cookies
    if isinstance(cookies, dict):
        if any(isinstance(value, Morsel) for value in cookies.values()):
            return {name: value.coded_value if isinstance(value, Morsel) else value for name, value in cookies.items()}
        return cookies
    if isinstance(cookies, (list, http.cookiejar.CookieJar)):
        return cookies
    jar = getattr(cookies, "jar", None)
    if isinstance(jar, http.cookiejar.CookieJar):  # another library's Cookies
        return [copy.copy(cookie) for cookie in jar]
    return cookies


def _wrap_init(cookies_cls: type) -> None:
    original = cookies_cls.__init__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, cookies: Any = None) -> None:
        converted = foreign_cookies_as_native(cookies, cookies_cls)
        if isinstance(converted, list) and converted and isinstance(converted[0], http.cookiejar.Cookie):
            original(self, None)
            for cookie in converted:
                self.jar.set_cookie(cookie)
            return
        original(self, converted)

    setattr(__init__, _MARK, True)
    cookies_cls.__init__ = __init__


def _patch_module(module: Any) -> None:
    cookies_cls = getattr(module, "Cookies", None)
    if isinstance(cookies_cls, type):
        _wrap_init(cookies_cls)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs `_patch_module` right after a watched module (`httpx2`) has been executed by its real loader."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[Any]:
        if fullname not in self.names:
            return None
        self.names.discard(fullname)
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module: Callable[[Any], None] = spec.loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            _patch_module(module)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


_hook: Optional[_PatchOnImport] = None


def install() -> None:
    """Make `httpx.Cookies` and `httpx2.Cookies` accept each other and `SimpleCookie` (see the module docstring).
    Safe to call many times; a library that is not installed is skipped."""
    global _hook
    with _lock:
        pending = set()
        for name in _PATCHED_MODULES:
            module = sys.modules.get(name)
            if module is not None:
                _patch_module(module)
            elif importlib.util.find_spec(name) is not None:
                pending.add(name)
        if pending and _hook is None:
            _hook = _PatchOnImport(pending)
            sys.meta_path.insert(0, _hook)
        elif pending and _hook is not None:
            _hook.names |= pending
