"""Running units of work: the runner, the executors, the resumable Parquet store and the records."""


class UnitFailed(RuntimeError):
    """A unit could not be computed: its worker died more often than the retries allow."""


class UnitStopped(ValueError):
    """A unit stopped by what it measures (e.g. a press that fails on a document): one line
    naming the action and the document; nothing of the unit is stored and the run stops."""
