"""Errors the `rmq` command reports as `error: <text>` on stderr with exit status 1."""


class CliError(Exception):
    """An expected failure of a command (bad input, a node that would not start, ...)."""


class ControlError(CliError):
    """An operation on a running cluster the supervisor refuses (unknown node, not running...)."""
