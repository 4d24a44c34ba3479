"""Errors the `rmq` command reports as `error: <text>` on stderr with exit status 1."""


class CliError(Exception):
    """An expected failure of a command (bad input, a node that would not start, ...)."""
