"""Running units of work: the runner, the executors, the resumable Parquet store and the records."""


class UnitFailed(RuntimeError):
    """A unit could not be computed: its worker died more often than the retries allow."""
