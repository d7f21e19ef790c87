"""Talking HTTP: the client our servers use to call each other, and the pieces around it.

Importing the package makes `httpx` / `httpx2` cookie containers accept each other (`cookie_interop`), so test code
that hands FastAPI's TestClient cookies from anywhere keeps working whichever library starlette builds it on.
"""

from nemo_gym.http import cookie_interop as _cookie_interop

_cookie_interop.install()
