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


# NeMo Gym v0.5 calls the user-facing config error `ConfigError` (exported by `nemo_gym.config_types`). It is the
# same class, not a look-alike, so `except ConfigError` catches every config mistake our code reports.
ConfigError = NeMoGymConfigError


class ConfigPathNotFoundError(NeMoGymConfigError, FileNotFoundError):
    """A file listed in `config_paths` (or env.yaml) that is in none of the places it is looked for."""


class MalformedConfigPathsError(NeMoGymConfigError):
    """`config_paths` that is not a list of file paths (a bare string, a number, an empty entry)."""


class NoServerInstancesError(NeMoGymConfigError):
    """A command that needs servers was given a config that defines none."""


class ConfigInterpolationError(NeMoGymConfigError):
    """A `${...}` that cannot be resolved: an unset key, an unset environment variable, bad syntax."""


class ServerRefNotFoundError(NeMoGymConfigError):
    """A `{type, name}` server reference naming no server of that type (the message suggests the closest)."""


class AlmostServerError(NeMoGymConfigError):
    """Blocks shaped like servers that fail validation, so they would silently not be started."""


class ConfigMissingValuesError(NeMoGymConfigError):
    """Required values left as `???`; all of them are named in one message."""


class InheritPathNotFoundError(NeMoGymConfigError):
    """An inherit/copy/move directive (`${inherit_from:a.b}`, `_inherit_from`, v0.2's `${swap_key:a.b}`) pointing at
    a key the config does not have."""


class NestedKeyTypoError(NeMoGymConfigError):
    """A key inside a server block or a framework section (`head_server`, `restart_policy`) that is most likely a
    misspelling of one of its fields (`verifed` for `verified`), from a config file or the command line
    (`nemo_gym.config.block_keys`)."""


CONFIG_ERROR_SUBCLASSES = (
    ConfigPathNotFoundError,
    MalformedConfigPathsError,
    NoServerInstancesError,
    ConfigInterpolationError,
    ServerRefNotFoundError,
    AlmostServerError,
    ConfigMissingValuesError,
    InheritPathNotFoundError,
)


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
