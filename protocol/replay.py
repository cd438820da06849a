"""Replay protection (receiver side) and sequence numbers that never repeat (sender side).

Both are plain state machines: the caller passes the current time in, and persists what
`SequenceCounter` asks it to persist. Neither reads a clock or touches a file.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .errors import ProtocolError, Reason
from .identity import node_id

__all__ = ["ReplayGuard", "SequenceCounter", "SequenceExhausted"]

_U64_MAX = (1 << 64) - 1


@dataclass
class _SenderWindow:
    highest: int  # highest sequence number accepted so far
    seen: int  # bit k set <=> highest - k was accepted (k < window)
    last_timestamp_us: int


class ReplayGuard:
    """Refuses a frame whose (sender, seq) was accepted before, or whose timestamp is too far
    from the receiver's clock.

    Per sender it keeps the highest sequence number and a bitmap of the `window` numbers below
    it, as IPsec and DTLS do: reordering within the window is fine, a repeat is `replay`, and a
    number below the window is `replay` because it can no longer be told apart from one.

    At most `max_senders` windows are kept (least recently used first out). Forgetting a sender
    could re-open its recent frames for replay, so the guard remembers the newest timestamp it
    ever evicted and refuses, from senders it has no window for, anything not newer than that.
    Frames older than `max_skew_us` are refused anyway, so that horizon stops mattering once
    the clock has moved on by the skew bound.
    """

    def __init__(self, *, window: int = 1024, max_skew_us: int = 60_000_000, max_senders: int = 4096) -> None:
        for name, value in (("window", window), ("max_skew_us", max_skew_us), ("max_senders", max_senders)):
            if type(value) is not int or value <= 0:
                raise ValueError(f"ReplayGuard {name} must be a positive integer, got {value!r}")
        self.window = window
        self.max_skew_us = max_skew_us
        self.max_senders = max_senders
        self._senders: OrderedDict[bytes, _SenderWindow] = OrderedDict()
        self._evicted_horizon_us = -1

    def __len__(self) -> int:
        return len(self._senders)

    def admit(self, sender: bytes, seq: int, timestamp_us: int, now_us: int) -> None:
        """Accept and record one frame's (sender, seq), or raise ProtocolError (replay/stale).

        Call it only for frames whose signature verified: recording unauthenticated numbers
        would let anyone burn an honest sender's window.
        """
        if abs(timestamp_us - now_us) > self.max_skew_us:
            raise ProtocolError(
                Reason.STALE,
                f"timestamp {(timestamp_us - now_us) / 1e6:+.3f} s from "
                f"this node's clock (bound ±{self.max_skew_us / 1e6:g} s)",
            )
        state = self._senders.get(sender)
        if state is None:
            if timestamp_us <= self._evicted_horizon_us:
                raise ProtocolError(
                    Reason.REPLAY,
                    f"{node_id(sender)}: no window kept and timestamp not newer than the eviction horizon",
                )
            self._remember(sender, _SenderWindow(highest=seq, seen=1, last_timestamp_us=timestamp_us))
            return
        self._senders.move_to_end(sender)
        if seq > state.highest:
            shift = seq - state.highest
            state.seen = ((state.seen << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
            state.highest = seq
        else:
            offset = state.highest - seq
            if offset >= self.window:
                raise ProtocolError(
                    Reason.REPLAY, f"{node_id(sender)}: seq {seq} below the window (highest {state.highest})"
                )
            bit = 1 << offset
            if state.seen & bit:
                raise ProtocolError(Reason.REPLAY, f"{node_id(sender)}: seq {seq} already seen")
            state.seen |= bit
        state.last_timestamp_us = max(state.last_timestamp_us, timestamp_us)

    def _remember(self, sender: bytes, state: _SenderWindow) -> None:
        self._senders[sender] = state
        while len(self._senders) > self.max_senders:
            _, evicted = self._senders.popitem(last=False)
            self._evicted_horizon_us = max(self._evicted_horizon_us, evicted.last_timestamp_us)


class SequenceExhausted(RuntimeError):
    """The reserved range is used up and no new reservation was persisted."""


class SequenceCounter:
    """Sequence numbers for one signing key that never repeat, across restarts too.

    A counter starts above both the last persisted reservation and the wall clock in
    microseconds: losing the state file is covered by the clock, a clock set back is covered
    by the state file. Numbers are only handed out below a reservation the owner has durably
    persisted, in two steps so that a failed write never lets the counter run ahead:

        counter = SequenceCounter(persisted=state.get("seq_reserved", 0), now_us=clock_us())
        limit = counter.propose_reservation()
        persist(limit)                    # durable write (fsync) ...
        counter.confirm_reservation(limit)  # ... before the numbers below it are used
        seq = counter.next()
        if counter.needs_reservation:     # half of the block is used: extend early
            ...same three lines...

    After a crash the next counter starts at the persisted reservation or later, so no number
    is reused; at most one block of numbers is skipped.
    """

    def __init__(self, *, persisted: int, now_us: int, block: int = 1 << 20) -> None:
        if type(persisted) is not int or persisted < 0 or type(now_us) is not int or now_us < 0:
            raise ValueError("persisted and now_us must be non-negative integers")
        if type(block) is not int or block <= 0:
            raise ValueError(f"block must be a positive integer, got {block!r}")
        self.block = block
        self._next = max(persisted, now_us)
        self.reserved_until = self._next  # only numbers below this may be used

    @property
    def needs_reservation(self) -> bool:
        return self.reserved_until - self._next <= self.block // 2

    def propose_reservation(self) -> int:
        """The reservation to persist next: one block beyond the next number."""
        return min(self._next + self.block, _U64_MAX + 1)

    def confirm_reservation(self, reserved_until: int) -> None:
        """Record that `reserved_until` is durably persisted; numbers below it may now be used."""
        if type(reserved_until) is not int or reserved_until > _U64_MAX + 1:
            raise ValueError(f"invalid reservation {reserved_until!r}")
        self.reserved_until = max(self.reserved_until, reserved_until)

    def next(self) -> int:
        if self._next >= self.reserved_until:
            raise SequenceExhausted(
                f"sequence {self._next} is not covered by a persisted "
                f"reservation (reserved until {self.reserved_until})"
            )
        seq = self._next
        self._next += 1
        return seq
