"""Running units of work: the runner, the executors, the resumable Parquet store and the records."""

from kvdrift.unit_errors import UnitFailed, UnitStopped

__all__ = ["UnitFailed", "UnitStopped"]
