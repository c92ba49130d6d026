"""An executor's settings (:class:`ExecutorConfig`), importable without torch: a study's
configuration is checked before the estimators load (:mod:`kvdrift.run.executors`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvdrift import checks

EXECUTORS = ("local", "ray")


def ray_endpoint(address: object) -> tuple[str, int]:
    """``(host, port)`` of a Ray cluster address ``[ray://]HOST:PORT``; else one clear error
    (``"auto"``, the other form ``ray_address`` takes, names no endpoint)."""
    text = address.removeprefix("ray://") if isinstance(address, str) else ""
    host, sep, port = text.rpartition(":")
    if not (sep and host.strip() and port.isdigit()):
        raise checks.refuse("ray_address", "'auto' or HOST:PORT (e.g. 10.0.0.1:6379)", address)
    return host, int(port)


@dataclass(frozen=True)
class ExecutorConfig:
    """Which executor runs the units, and the Ray settings (ignored by ``local``).

    ``ray_address`` joins an existing cluster (``"auto"`` or ``HOST:PORT``); without it a
    local Ray instance starts with this machine's CPUs and GPUs. ``gpus_per_worker`` defaults
    to 1 where the cluster has GPUs (one worker per GPU) and 0 otherwise; ``max_retries`` is
    how often a unit is retried after its worker died before the run stops.
    """

    kind: str = "local"
    ray_address: str | None = None
    gpus_per_worker: float | None = None
    cpus_per_worker: float = 1.0
    max_retries: int = 2

    def __post_init__(self) -> None:
        checks.choice(self.kind, "executor", EXECUTORS)
        if self.ray_address not in (None, "auto"):
            ray_endpoint(self.ray_address)
        if self.gpus_per_worker is not None:
            checks.number(self.gpus_per_worker, "gpus_per_worker", 0, rule="a number >= 0")
        checks.number(self.cpus_per_worker, "cpus_per_worker", 0, open_lo=True,
                      rule="a number > 0")
        checks.integer(self.max_retries, "max_retries", 0)

    def overridden(self, kind: str | None = None, ray_address: str | None = None
                   ) -> ExecutorConfig:
        """These settings with the command line's ``--executor``/``--ray-address`` applied.

        An address implies the Ray executor; asking for ``local`` with an address is a mistake.
        """
        if ray_address is not None:
            if kind == "local":
                raise ValueError("--ray-address needs the ray executor; got --executor local")
            kind = "ray"
        changes = {k: v for k, v in (("kind", kind), ("ray_address", ray_address))
                   if v is not None}
        return replace(self, **changes)

    def for_device(self, device: str) -> ExecutorConfig:
        """A model placed on the CPU takes no GPU per worker unless one is asked for."""
        if self.gpus_per_worker is None and str(device) == "cpu":
            return replace(self, gpus_per_worker=0.0)
        return self
