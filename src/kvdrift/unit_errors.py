"""Errors that end a unit of work: raised where a unit is computed (a kernel pair, a worker),
told to the user by the runner in one line."""


class UnitFailed(RuntimeError):
    """A unit could not be computed: its worker died more often than the retries allow."""


class UnitStopped(ValueError):
    """A unit stopped by what it measures (e.g. a press that fails on a document): one line
    naming the action and the document; nothing of the unit is stored and the run stops."""
