"""Errors every architecture raises the same way."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the update (and seed)."""


class RunDirectoryError(ValueError):
    """A run directory that cannot be read back: no settings, no checkpoint, or one that does not fit them."""
