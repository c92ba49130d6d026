"""Running units of work: the runner, the resumable Parquet store and the record tables."""
