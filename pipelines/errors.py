"""Errors Conflux raises for problems a user can fix."""


class ConfigError(Exception):
    """A misconfiguration: the message names the problem and how to fix it."""
