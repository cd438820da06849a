"""The sequence numbers this node signs with, reserved in blocks in the state file before use,
so that a restart never signs with a number used before (peers' replay guards would drop it).

A block is extended in the background when the counter runs low. If it cannot be saved (a full
disk), the node signs with the numbers still reserved, then refuses to send (counted as
`send_refused`, logged once) until a later attempt saves it: no number is ever used twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from protocol import Body, SequenceCounter, SequenceExhausted

from ..data_dir import DataDir, DataDirError
from ..metrics import Metrics

__all__ = ["RESERVATION_RETRY_S", "SequenceReservation"]

log = logging.getLogger("p2pnode.node")

# After a failed attempt to extend the sequence reservation (a full disk), wait this long
# before the next: every send would otherwise start one, and each logs why it failed.
RESERVATION_RETRY_S = 5.0


class SequenceReservation:
    """The counter of the frames this node signs, over the reservation saved in `data_dir`.
    Raises DataDirError if the state file cannot be read or the first reservation saved."""

    def __init__(self, data_dir: DataDir, clock_us: Callable[[], int], metrics: Metrics) -> None:
        self.data_dir, self.metrics = data_dir, metrics
        state = data_dir.load_state()
        persisted = state.get("seq_reserved", 0)
        if type(persisted) is not int or persisted < 0:
            raise DataDirError(f"state file holds an invalid seq_reserved {persisted!r}")
        self.counter = SequenceCounter(persisted=persisted, now_us=clock_us())
        self._persist()  # before the first frame goes out
        # Where the reservation is extended in the background; none outside the node's nursery.
        self.nursery: trio.Nursery | None = None
        self._reserving = False
        self._retry_at = -math.inf  # no extension of the reservation before this time
        self._refusing_sends = False  # no sequence number is reserved: sends are refused

    def next(self, body: Body) -> int | None:
        """The next sequence number, or None (counted, and logged once) while none is reserved."""
        counter = self.counter
        if counter.needs_reservation:  # an exhausted counter too: that is how sending resumes
            self._extend_soon()
        try:
            return counter.next()
        except SequenceExhausted as exc:
            self.metrics.send_refused[body.TYPE] += 1
            if not self._refusing_sends:
                self._refusing_sends = True
                log.error(
                    "not sending %s, nor anything else until the sequence reservation is saved in "
                    "[node].data_dir: %s; refused sends are counted as send_refused",
                    body.TYPE.value,
                    exc,
                )
            return None

    def _persist(self) -> None:
        limit = self.counter.propose_reservation()
        state = self.data_dir.load_state()
        state["seq_reserved"] = limit
        self.data_dir.save_state(state)
        self.counter.confirm_reservation(limit)

    def _extend_soon(self) -> None:
        """Persist a new block of sequence numbers in the background, unless an attempt is
        under way or one failed a moment ago."""
        if self._reserving or self.nursery is None or trio.current_time() < self._retry_at:
            return
        self._reserving = True
        self.nursery.start_soon(self._extend)

    async def _extend(self) -> None:
        try:
            await trio.to_thread.run_sync(self._persist)
        except DataDirError as exc:
            # The numbers already reserved are still used; none beyond them, so none repeats.
            self.metrics.state_write_failures += 1
            self._retry_at = trio.current_time() + RESERVATION_RETRY_S
            log.error(
                "[node].data_dir: the sequence reservation was not extended: %s; the node signs with "
                "the numbers still reserved, then refuses to send until it is saved (retried every %g s)",
                exc,
                RESERVATION_RETRY_S,
            )
        else:
            if self._refusing_sends:
                log.warning("the sequence reservation is saved again: sending resumes")
            self._refusing_sends = False
        finally:
            self._reserving = False
