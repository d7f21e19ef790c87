"""User-facing errors: raised for mistakes the user can fix, printed without a traceback."""


class NeMoGymConfigError(ValueError):
    """A configuration mistake. The message names the file, key or server and says what to do.

    The CLI prints the message and exits with status 2. Subclasses ValueError so code written
    against the reference (which raised ValueError/AssertionError) still catches it.
    """

    exit_code = 2
