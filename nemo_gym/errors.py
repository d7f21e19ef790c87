"""User-facing errors: raised for mistakes the user can fix, printed without a traceback, with a suggestion."""

import difflib
from typing import Iterable, Optional


class NeMoGymConfigError(ValueError):
    """A configuration mistake. The message names the file, key or server and says what to do.

    The CLI prints the message and exits with status 2. Subclasses ValueError so code written
    against the reference (which raised ValueError/AssertionError) still catches it.
    """

    exit_code = 2
    # Text this error already wrote to stderr as a warning while the config was built (the almost-server
    # banner); the CLI prints such warnings after the error line and leaves this part out, so it is not said twice.
    already_reported: str = ""


class NeMoGymStackError(NeMoGymConfigError):
    """The stack a command needs is not there or failed: no head server answers on that port, a server crashed
    while starting, a server environment could not be built. Printed like a config mistake (one line naming the
    server, no traceback), but the exit status is 1: the command line itself may be right."""

    exit_code = 1


def closest_match(name: str, known: Iterable[str], cutoff: float = 0.6) -> Optional[str]:
    """The known name a misspelled `name` most likely meant, or None."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=cutoff)
    return close[0] if close and close[0] != name else None


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """`" Did you mean `x`?"` to append to an error message, or "" when nothing is close."""
    close = closest_match(name, known, cutoff)
    return f" Did you mean `{close}`?" if close else ""
