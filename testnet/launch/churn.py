"""Daemons that stop during a testnet run: on purpose (`--churn`), or not (`--restart`,
`--keep-going`).

`--churn every=20s,down=10s[,count=N][,signal=kill|term]`: once the run is under way (every
daemon up; for learning, every daemon has finished a round, so has a checkpoint, or has gone
down since it started), every `every` seconds (counted from the previous stop) one running
daemon, chosen at random with the run's seed, is stopped by the signal and started again
`down` seconds later with the same key, config and data directory, on the same address (its
peers know it by that address), so a learning daemon resumes from its checkpoint. At most
`count` daemons are stopped in all (no bound if omitted). SIGKILL is the default: it is what
a crash or a power cut does, and it leaves no BYE and no last checkpoint behind, so it tests
the paths a clean stop (`signal=term`) never reaches.

A daemon that exits without being told to is recorded (exit code, time). With `--restart` it
is started again the same way as a churned one, after a backoff that doubles with each of its
restarts (`RestartPolicy`), at most `--max-restarts` times; as systemd's `Restart=on-failure`
with `RestartPreventExitStatus=2` would (deploy/systemd/p2pnode@.service), a clean exit (0) and
an invalid configuration (2) are not restarted. A daemon not restarted, or past its restarts,
is an exit: without `--keep-going` that ends the run, as before; with it the others go on
without it.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from p2pnode.exits import EXIT_OK, EXIT_USAGE

from .cluster import Cluster, NodeSpec

__all__ = ["ChurnSpec", "RestartPolicy", "Supervisor"]

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}

# Exit statuses of `p2pnode start` that a restart cannot change: why the daemon is not started again.
NOT_RESTARTED = {EXIT_OK: "it stopped cleanly", EXIT_USAGE: "its configuration is invalid"}


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


@dataclass(frozen=True)
class RestartPolicy:
    """`--restart`: a daemon that dies on its own is started again, at most `max_restarts`
    times, the k-th time `backoff_s` × 2^(k-1) seconds after it was found dead (so that a daemon
    that crashes as it starts does not take the CPU from the others)."""

    max_restarts: int = 3
    backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_restarts < 1:
            raise ValueError(f"--max-restarts: expected a positive integer, got {self.max_restarts}")
        if not 0 < self.backoff_s < float("inf"):
            raise ValueError(f"--restart-backoff: expected a positive number of seconds, got {self.backoff_s}")

    def delay_s(self, restarts_so_far: int) -> float:
        return self.backoff_s * 2**restarts_so_far


def signal_name(exit_code: int | None) -> str | None:
    """The signal that killed a process (`SIGKILL`), from its Popen return code (-9); None if
    none did."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return None


def _how(death: dict[str, Any]) -> str:
    return death["signal"] or f"code {death['exit_code']}"


class Supervisor:
    """Watches a cluster's daemons for a run's poll loop: stops and restarts them as `churn`
    says, restarts those that die on their own as `restart` allows, and records every daemon
    that exits on its own and stays down. Times are seconds since `started` (a
    `time.monotonic()` value)."""

    def __init__(
        self,
        cluster: Cluster,
        churn: ChurnSpec | None,
        *,
        seed: int,
        keep_going: bool,
        started: float,
        last_stop_s: float = float("inf"),
        restart: RestartPolicy | None = None,
        progress: TextIO,
    ) -> None:
        self.cluster = cluster
        self.churn = churn
        self.restart = restart
        self.keep_going = keep_going
        self.started = started
        self.last_stop_s = last_stop_s  # no stop is started later than this
        self.progress = progress
        self.events: list[dict[str, Any]] = []  # one per churn stop, filled in as the daemon comes back
        self.restarts: list[dict[str, Any]] = []  # one per restart of a daemon that died on its own
        self.exits: list[dict[str, Any]] = []  # daemons that exited on their own and stay down
        self._downtimes: list[dict[str, Any]] = []  # the events of both kinds, in the order they began
        self._random = random.Random(seed)
        self._next_stop_s: float | None = None  # set by `arm`
        # Down, churned or dead, until it is started again: node index → (when, its event, "churn" or "restart").
        self._down: dict[int, tuple[float, dict[str, Any], str]] = {}
        self._coming_back: dict[int, tuple[dict[str, Any], str]] = {}  # started again, not answering yet

    def _now(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def _say(self, line: str) -> None:
        print(line, file=self.progress, flush=True)

    def arm(self) -> None:
        """The run is under way: the first stop comes `every` seconds from now (once only)."""
        if self.churn is not None and self._next_stop_s is None:
            self._next_stop_s = self._now() + self.churn.every_s

    def downtimes(self) -> list[dict[str, Any]]:
        """Every time a daemon went down and was (or is to be) started again, churn's stops and
        the restarts of daemons that died, in the order they went down."""
        return self._downtimes

    def unhealed(self, key: str) -> list[int]:
        """The nodes whose last downtime has no `key` yet (e.g. `mesh_s`): not back as far as
        that. An earlier downtime after which the daemon died again does not count."""
        last = {event["node"]: event for event in self._downtimes}
        return sorted(node for node, event in last.items() if event.get(key) is None)

    def lost(self, spec: NodeSpec) -> bool:
        """Exited on its own, and not coming back."""
        return any(entry["node"] == spec.index for entry in self.exits)

    def busy(self) -> bool:
        """A daemon is down or restarting, and coming back: the run must not end yet."""
        return bool(self._down or self._coming_back)

    def done(self) -> bool:
        """No churn stop is left to make (all made, or none allowed any more) and every daemon
        stopped or restarted answers again."""
        churn = self.churn
        more = churn is not None and (
            self._next_stop_s is None
            or ((churn.count is None or len(self.events) < churn.count) and self._next_stop_s <= self.last_stop_s)
        )
        return not more and not self.busy()

    def poll(self, statuses: list[dict | None], eligible: Collection[int] | None = None) -> bool:
        """One step: start again the daemons whose downtime is over, note those that answer
        again, restart or record daemons that exited on their own, and stop one if one is due
        (among the running daemons whose index is in `eligible`; None: all). Returns False when
        the run must end: a daemon exited on its own, is not restarted, and `keep_going` is off."""
        now = self._now()
        for index, (at, event, cause) in list(self._down.items()):
            if now >= at:
                self.cluster.start(self.cluster.specs[index])
                event["restarted_s"] = self._now()
                del self._down[index]
                self._coming_back[index] = (event, cause)
                self._say(f"{cause}: node {index} restarted")
        for index, (event, cause) in list(self._coming_back.items()):
            if statuses[index] is not None:
                event["up_s"] = self._now()
                del self._coming_back[index]
                went_down = event["exited_s"] if cause == "restart" else event["killed_s"]
                event["back_after_s"] = round(event["up_s"] - went_down, 3)
                self._say(f"{cause}: node {index} answers again, {event['back_after_s']:.1f} s after it went down")
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
            "back_after_s": None,
        }
        self.events.append(event)
        self._downtimes.append(event)
        self._down[spec.index] = (killed_s + self.churn.down_s, event, "churn")
        self._say(
            f"churn: node {spec.index} stopped ({signum.name}) at {killed_s:.1f} s; back in {self.churn.down_s:g} s"
        )

    def _note_resumes(self, statuses: list[dict | None]) -> None:
        """A learning daemon that came back says which checkpoint it resumed from."""
        for event in self.downtimes():
            status = statuses[event["node"]]
            if event["up_s"] is not None and "resumed_from" not in event and status and status.get("learning"):
                learning = status["learning"]
                if learning["algorithm"]:  # data and model loaded, checkpoint read
                    event["resumed_from"] = learning["resumed_from"]
                    if "restart" in event:
                        resumed = learning["resumed_from"]
                        where = "from round 0 (no checkpoint yet)" if resumed is None else f"after round {resumed}"
                        self._say(f"restart: node {event['node']} resumed {where}")

    def _note_exits(self) -> bool:
        carry_on = True
        for spec in self.cluster.specs:
            if self.cluster.alive(spec) or spec.process is None or spec.index in self._down or self.lost(spec):
                continue
            self._coming_back.pop(spec.index, None)  # died again before it answered
            code = spec.process.returncode
            restarts = sum(event["node"] == spec.index for event in self.restarts)
            why_not = self._why_not_restarted(spec, code, restarts)
            if why_not is None:
                self._restart_later(spec, code, restarts)
                continue
            death = {**self._death(spec, code), "restarts": restarts}
            self.exits.append(death)
            verdict = "going on without it (--keep-going)" if self.keep_going else "stopping the run"
            self._say(f"node {spec.index} exited ({_how(death)}){why_not}; see {self.cluster.log(spec)}; {verdict}")
            carry_on = carry_on and self.keep_going
        return carry_on

    def _why_not_restarted(self, spec: NodeSpec, code: int | None, restarts: int) -> str | None:
        """None if the daemon is to be restarted; else why not, as the exit line's words."""
        if self.restart is None:
            return ""
        if self.cluster.placement.lost(spec):
            return ", not restarted: the place it ran is gone"
        if code in NOT_RESTARTED:
            return f", not restarted: {NOT_RESTARTED[code]}"
        if restarts >= self.restart.max_restarts:
            return f" after {restarts} restarts (--max-restarts {self.restart.max_restarts})"
        return None

    def _death(self, spec: NodeSpec, code: int | None) -> dict[str, Any]:
        """Who died, how (its exit code, and the signal that killed it, if one did), and when
        the launcher found it dead (it looks at every poll). A daemon lost with the place it ran
        has the placement's code (Ray's `LOST`, -1), no signal's."""
        return {
            "node": spec.index,
            "node_id": spec.node_id,
            "exit_code": code,
            "signal": None if self.cluster.placement.lost(spec) else signal_name(code),
            "exited_s": self._now(),
        }

    def _restart_later(self, spec: NodeSpec, code: int | None, restarts: int) -> None:
        event = {
            **self._death(spec, code),
            "restart": restarts + 1,
            "restarted_s": None,
            "up_s": None,
            "back_after_s": None,
        }
        self.restarts.append(event)
        self._downtimes.append(event)
        exited_s, delay_s = event["exited_s"], self.restart.delay_s(restarts)
        self._down[spec.index] = (exited_s + delay_s, event, "restart")
        self._say(
            f"restart: node {spec.index} died ({_how(event)}) at {exited_s:.1f} s; restart "
            f"{restarts + 1} of {self.restart.max_restarts} in {delay_s:g} s; see {self.cluster.log(spec)}"
        )

    def stamp(self, key: str) -> None:
        """Record now as `key` on every downtime whose daemon answers again and has no `key` yet
        (e.g. `mesh_s`: when every node knew every other again)."""
        for event in self.downtimes():
            if event["up_s"] is not None and event.get(key) is None:
                event[key] = self._now()

    def report(self) -> dict[str, Any]:
        """`churn` (null without --churn: the spec and one entry per stop), `restarts` (null
        without --restart: the policy and one entry per restart) and `exits`."""
        churn = None if self.churn is None else {"spec": asdict(self.churn), "events": self.events}
        restarts = None if self.restart is None else {"policy": asdict(self.restart), "events": self.restarts}
        return {"churn": churn, "restarts": restarts, "exits": self.exits}
