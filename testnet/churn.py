"""Daemons that stop during a testnet run: on purpose (`--churn`), or not (`--keep-going`).

`--churn every=20s,down=10s[,count=N][,signal=kill|term]`: once the run is under way (every
daemon up; for learning, every daemon has loaded its data and model), every `every` seconds
(counted from the previous stop) one running daemon, chosen at random with the run's seed, is
stopped by the signal and started again `down` seconds later with the same key, config and data
directory, on the same address (its peers know it by that address), so a learning daemon
resumes from its checkpoint. At most `count` daemons are stopped in all (no bound if omitted).
SIGKILL is the default: it is what a crash or a power cut does, and it leaves no BYE and no
last checkpoint behind, so it tests the paths a clean stop (`signal=term`) never reaches.

A daemon that exits without being told to is recorded (exit code, time). Without
`--keep-going` that ends the run, as before; with it the others go on without it.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from .cluster import Cluster, NodeSpec

__all__ = ["ChurnSpec", "Supervisor"]

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}


def _seconds(key: str, text: str) -> float:
    try:
        value = float(text.removesuffix("s"))
    except ValueError:
        raise ValueError(f"--churn {key}: expected seconds such as 20s, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise ValueError(f"--churn {key}: expected a non-negative number of seconds, got {text!r}")
    return value


@dataclass(frozen=True)
class ChurnSpec:
    every_s: float  # seconds between two stops
    down_s: float  # seconds a stopped daemon stays down
    count: int | None = None  # daemons stopped in all; None: no bound
    signal: str = "kill"  # a key of SIGNALS

    @classmethod
    def parse(cls, text: str) -> ChurnSpec:
        """`every=S,down=S[,count=N][,signal=kill|term]`, seconds with an optional `s`; raises
        ValueError saying what is wrong."""
        fields: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in ("every", "down", "count", "signal"):
                raise ValueError(f"--churn: {item!r} is not one of every=S, down=S, count=N, signal=kill|term")
            fields[key] = value.strip()
        missing = [key for key in ("every", "down") if key not in fields]
        if missing:
            raise ValueError(f"--churn: {' and '.join(missing)} missing (e.g. --churn every=20s,down=10s)")
        every, down = _seconds("every", fields["every"]), _seconds("down", fields["down"])
        if every <= 0:
            raise ValueError(f"--churn every: must be above 0 s, got {fields['every']!r}")
        count = None
        if "count" in fields:
            if not fields["count"].isdigit() or int(fields["count"]) < 1:
                raise ValueError(f"--churn count: expected a positive integer, got {fields['count']!r}")
            count = int(fields["count"])
        kind = fields.get("signal", "kill")
        if kind not in SIGNALS:
            raise ValueError(f"--churn signal: expected kill or term, got {kind!r}")
        return cls(every, down, count, kind)


class Supervisor:
    """Watches a cluster's daemons for a run's poll loop: stops and restarts them as `churn`
    says, and records every daemon that exits on its own. Times are seconds since `started`
    (a `time.monotonic()` value)."""

    def __init__(
        self,
        cluster: Cluster,
        churn: ChurnSpec | None,
        *,
        seed: int,
        keep_going: bool,
        started: float,
        last_stop_s: float = float("inf"),
        progress: TextIO,
    ) -> None:
        self.cluster = cluster
        self.churn = churn
        self.keep_going = keep_going
        self.started = started
        self.last_stop_s = last_stop_s  # no stop is started later than this
        self.progress = progress
        self.events: list[dict[str, Any]] = []  # one per stop, filled in as the daemon comes back
        self.exits: list[dict[str, Any]] = []  # daemons that exited on their own
        self._random = random.Random(seed)
        self._next_stop_s: float | None = None  # set by `arm`
        self._down: dict[int, dict[str, Any]] = {}  # node index → its event, until it is restarted
        self._coming_back: dict[int, dict[str, Any]] = {}  # restarted, not answering yet

    def _now(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def arm(self) -> None:
        """The run is under way: the first stop comes `every` seconds from now (once only)."""
        if self.churn is not None and self._next_stop_s is None:
            self._next_stop_s = self._now() + self.churn.every_s

    def lost(self, spec: NodeSpec) -> bool:
        """Exited on its own: not coming back."""
        return any(entry["node"] == spec.index for entry in self.exits)

    def busy(self) -> bool:
        """A daemon is down or restarting on purpose: the run must not end yet."""
        return bool(self._down or self._coming_back)

    def done(self) -> bool:
        """No stop is left to make (all made, or none allowed any more) and every stopped daemon
        answers again."""
        churn = self.churn
        if churn is None:
            return True
        more = self._next_stop_s is None or (
            (churn.count is None or len(self.events) < churn.count) and self._next_stop_s <= self.last_stop_s
        )
        return not more and not self.busy()

    def poll(self, statuses: list[dict | None], eligible: Collection[int] | None = None) -> bool:
        """One step: restart the daemons whose downtime is over, note those that answer again,
        record daemons that exited on their own, and stop one if one is due (among the running
        daemons whose index is in `eligible`; None: all). Returns False when the run must end:
        a daemon exited on its own and `keep_going` is off."""
        now = self._now()
        for index, event in list(self._down.items()):
            if now >= event["killed_s"] + self.churn.down_s:
                self.cluster.start(self.cluster.specs[index])
                event["restarted_s"] = self._now()
                self._coming_back[index] = self._down.pop(index)
                print(f"churn: node {index} restarted", file=self.progress, flush=True)
        for index, event in list(self._coming_back.items()):
            status = statuses[index]
            if status is not None:
                event["up_s"] = self._now()
                del self._coming_back[index]
        self._note_resumes(statuses)
        carry_on = self._note_exits()
        if self._due(now):
            self._stop_one(eligible)
        return carry_on

    def _due(self, now: float) -> bool:
        churn, at = self.churn, self._next_stop_s
        if churn is None or at is None or now < at or at > self.last_stop_s:
            return False
        return churn.count is None or len(self.events) < churn.count

    def _stop_one(self, eligible: Collection[int] | None) -> None:
        candidates = [
            spec
            for spec in self.cluster.specs
            if self.cluster.alive(spec)
            and spec.index not in self._coming_back
            and (eligible is None or spec.index in eligible)
        ]
        if not candidates:
            self._next_stop_s += self.churn.every_s
            return  # nobody to stop this time (all down, restarting or finished)
        spec = self._random.choice(candidates)
        signum = SIGNALS[self.churn.signal]
        killed_s = self._now()
        self._next_stop_s = killed_s + self.churn.every_s  # counted from this stop: never closer
        self.cluster.kill(spec, signum, timeout=self.cluster.stop_grace_s)
        event = {
            "node": spec.index,
            "node_id": spec.node_id,
            "signal": signum.name,
            "killed_s": killed_s,
            "exit_code": spec.process.returncode,
            "restarted_s": None,
            "up_s": None,
        }
        self.events.append(event)
        self._down[spec.index] = event
        print(
            f"churn: node {spec.index} stopped ({signum.name}) at {killed_s:.1f} s; back in {self.churn.down_s:g} s",
            file=self.progress,
            flush=True,
        )

    def _note_resumes(self, statuses: list[dict | None]) -> None:
        """A learning daemon that came back says which checkpoint it resumed from."""
        for event in self.events:
            status = statuses[event["node"]]
            if event["up_s"] is not None and "resumed_from" not in event and status and status.get("learning"):
                learning = status["learning"]
                if learning["algorithm"]:  # data and model loaded, checkpoint read
                    event["resumed_from"] = learning["resumed_from"]

    def _note_exits(self) -> bool:
        carry_on = True
        for spec in self.cluster.specs:
            if self.cluster.alive(spec) or spec.process is None or spec.index in self._down or self.lost(spec):
                continue
            code = spec.process.returncode
            self.exits.append({"node": spec.index, "node_id": spec.node_id, "exit_code": code, "exited_s": self._now()})
            self._coming_back.pop(spec.index, None)
            verdict = "going on without it (--keep-going)" if self.keep_going else "stopping the run"
            print(
                f"node {spec.index} exited (code {code}); see {self.cluster.log(spec)}; {verdict}", file=self.progress
            )
            carry_on = carry_on and self.keep_going
        return carry_on

    def stamp(self, key: str) -> None:
        """Record now as `key` on every event whose daemon answers again and has no `key` yet
        (e.g. `mesh_s`: when every node knew every other again)."""
        for event in self.events:
            if event["up_s"] is not None and event.get(key) is None:
                event[key] = self._now()

    def report(self) -> dict[str, Any]:
        """`churn` (null without --churn: the spec and one entry per stop) and `exits`."""
        churn = None if self.churn is None else {"spec": asdict(self.churn), "events": self.events}
        return {"churn": churn, "exits": self.exits}
