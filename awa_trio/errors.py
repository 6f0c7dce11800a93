"""Errors awa_trio raises at its public boundary.

Database errors live in :mod:`awa_trio.db`; these are the domain errors a
caller (the CLI, an embedding application) is expected to catch and report
as one line.
"""


class AwaTrioError(Exception):
    """Base class of every error awa_trio raises on purpose."""


class ConfigError(AwaTrioError, ValueError):
    """A setting is invalid; the message names the field."""


class UnsupportedSchema(AwaTrioError):
    """The database's Awa schema is missing, too old, too new, or on an
    engine awa_trio cannot maintain."""


class LeadershipAbandoned(AwaTrioError):
    """A branch kept crashing, so this node gave up leadership on purpose."""
