"""Hosts as Ray actors: the `ray` engine of testnet/simulation/hosting.py, for runs beyond one machine.

Ray is an optional extra (`pip install 'p2pnode[ray]'`), imported only here and only when the
engine is chosen. Without an address a local Ray is started for the run and stopped after it;
with one (`ray://host:10001`, `host:6379`, `auto`) the actors go to that cluster, whose
machines need p2pnode and its dependencies installed as on this one. A Ray that is already
running in this process (a test's, a notebook's) is used as it is and left running.

Each actor is one host (testnet/simulation/host.py) taking one CPU; when the run's device is not the CPU
and the cluster has GPUs, each actor asks for an equal share of them, so Ray makes them visible
to it. Waits are bounded as in testnet/simulation/workers.py, and a failure names the host and, where a
node raised, the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..ray_extra import ray_missing
from .exchange import Arguments
from .host import Host, blocks
from .shard import NodeFailed, SimulationError
from .spec import SimulationSpec

__all__ = ["RayHosts"]


class RayHosts:
    def __init__(
        self, spec: SimulationSpec, workers: int | None, threads: int, address: str | None, timeout_s: float
    ) -> None:
        """`workers` actors (None: one per CPU of the cluster) with `threads` torch threads each."""
        missing = ray_missing()
        if missing:
            raise SimulationError(missing)
        import ray

        self.ray = ray
        self.timeout_s = timeout_s
        self._started = not ray.is_initialized()
        if self._started:
            ray.init(address=address, include_dashboard=False, logging_level="warning")
        self._actors: list[Any] = []
        self._posted: list[tuple[int, Any, str]] = []  # calls sent without waiting, in order
        try:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            if workers is not None and workers > cpus:
                raise SimulationError(f"--workers {workers}: the Ray cluster has {cpus} CPUs, one per worker")
            self.blocks = blocks(spec.nodes, workers or cpus)
            gpus = ray.cluster_resources().get("GPU", 0) if spec.device != "cpu" else 0
            share = min(1.0, gpus / len(self.blocks))
            actor = ray.remote(num_cpus=1, num_gpus=share)(HostActor)
            self._actors = [actor.remote() for _ in self.blocks]
            self.call("start", [(spec, block, threads) for block in self.blocks])
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RayHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, args: Sequence[Arguments]) -> list[Any]:
        posted, self._posted = self._posted, []
        self._gather(posted)  # an actor runs its calls in order: these are done before the new ones
        called = self._send(method, args)
        answers = dict(zip((h for h, _, _ in called), self._gather(called), strict=True))
        return [answers.get(h) for h in range(len(self._actors))]

    def post(self, method: str, args: Sequence[Arguments]) -> None:
        self._posted += self._send(method, args)

    def _send(self, method: str, args: Sequence[Arguments]) -> list[tuple[int, Any, str]]:
        return [
            (h, actor.call.remote(method, arguments), method)
            for h, (actor, arguments) in enumerate(zip(self._actors, args, strict=True))
            if arguments is not None
        ]

    def close(self) -> None:
        for actor in self._actors:
            self.ray.kill(actor)
        self._actors = []
        if self._started:
            self.ray.shutdown()
            self._started = False

    def _gather(self, calls: list[tuple[int, Any, str]]) -> list[Any]:
        """The answers to `calls` (host, its call's ref, the method), in order; raises, naming the
        host, at the first failure."""
        ray = self.ray
        if not calls:
            return []
        refs = [ref for _, ref, _ in calls]
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)
        if pending:
            late = ", ".join(f"{self._name(h)} ({method})" for h, ref, method in calls if ref in pending)
            raise SimulationError(f"no answer within {self.timeout_s:g} s from {late}")
        answers = []
        for h, ref, method in calls:
            try:
                answers.append(ray.get(ref))
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None) or exc
                if isinstance(cause, NodeFailed):
                    raise NodeFailed(f"{cause}; it ran in {self._name(h)}") from None
                raise SimulationError(f"{self._name(h)} failed in {method}: {type(cause).__name__}: {cause}") from None
            except ray.exceptions.RayActorError as exc:
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise SimulationError(f"{self._name(h)} died during {method}: {why}") from None
        return answers

    def _name(self, h: int) -> str:
        block = self.blocks[h]
        return f"Ray host {h} (nodes {block[0]}–{block[-1]})"


class HostActor:
    """What Ray runs: a host built by a method, not the actor's constructor, so that a failure to
    build comes back as the error it is rather than as a dead actor."""

    def __init__(self) -> None:
        self.host: Host | None = None

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        if method == "start":
            self.host = Host(*args, worker=True)
            return None
        return getattr(self.host, method)(*args)
