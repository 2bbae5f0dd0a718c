"""The one error type that the command line turns into a one-line message and exit status 2."""


class UsageError(ValueError):
    """Bad input from the user: a malformed config, an unknown field, impossible shapes, a table
    missing columns. The message is one line that names the problem."""
