"""Where a simulation's hosts run: the engines of `p2pnode simulate --engine`.

- `inline`: one host holding every node, in this process (the default for one worker).
- `processes`: one host per worker process on this machine (forked where that is safe, each
  with its own torch threads: one by default), talking over pipes (testnet/simulation/workers.py).
- `ray`: one host per Ray actor, on a local Ray or a cluster (testnet/simulation/rayhosts.py; the optional
  extra `pip install 'p2pnode[ray]'`).

All three run the same hosts (testnet/simulation/host.py) under the same exchange (testnet/simulation/exchange.py),
so a run gives the same report whatever the engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .exchange import Hosts, InlineHosts
from .host import Host, blocks
from .spec import SimulationSpec

__all__ = ["ENGINES", "Engine", "INLINE", "default_engine", "open_hosts", "cores"]

ENGINES = ("inline", "processes", "ray")
DEFAULT_TIMEOUT_S = 1800.0  # one command of one host: a round's local steps of all its nodes


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Engine:
    """How a simulation runs: `kind` (one of ENGINES), `workers` hosts (None: one per core for
    processes, one per CPU of the cluster for Ray), `threads` torch and BLAS threads per host (None: one
    in a worker, torch's own default inline), `ray_address` of a Ray cluster (None: a local Ray
    started for the run), `timeout_s` the most a host may take over one command."""

    kind: str = "inline"
    workers: int | None = None
    threads: int | None = None
    ray_address: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.kind not in ENGINES:
            raise ValueError(f"unknown engine {self.kind!r}; choose from {', '.join(ENGINES)}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be ≥ 1, got {self.workers}")
        if self.kind == "inline" and self.workers not in (None, 1):
            raise ValueError(f"the inline engine runs one host in this process, not {self.workers} workers")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be ≥ 1, got {self.threads}")
        if self.ray_address is not None and self.kind != "ray":
            raise ValueError("a Ray address needs the ray engine")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    def describe(self, hosts: int) -> dict[str, object]:
        """What the report records about the engine, in its provenance (results do not depend on
        it); the simulator adds each host's nodes, memory and CPU time at the end."""
        return {"kind": self.kind, "workers": hosts, "threads": self.threads, "ray_address": self.ray_address}


INLINE = Engine()


def default_engine(nodes: int) -> Engine:
    """`simulate`'s engine when none is named: a worker process per core, inline where only one
    would have nodes to run."""
    return INLINE if min(cores(), nodes) == 1 else Engine("processes")


@contextmanager
def open_hosts(spec: SimulationSpec, engine: Engine) -> Iterator[Hosts]:
    """The hosts of `spec`'s run on `engine`, torn down when the block ends (errors included)."""
    if engine.kind == "inline":
        yield InlineHosts([Host(spec, range(spec.nodes), engine.threads)])
    elif engine.kind == "processes":
        from .workers import ProcessHosts

        parts = blocks(spec.nodes, engine.workers or cores())
        with ProcessHosts(spec, parts, threads=engine.threads or 1, timeout_s=engine.timeout_s) as hosts:
            yield hosts
    else:
        from .rayhosts import RayHosts

        with RayHosts(spec, engine.workers, engine.threads or 1, engine.ray_address, engine.timeout_s) as hosts:
            yield hosts
