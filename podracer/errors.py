"""Errors every architecture raises the same way."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the update (and seed)."""
