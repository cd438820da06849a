"""Dial-backs (AutoNAT, issue #46): a node asks the nodes it reaches to dial it back, and answers
their asking in turn.

A node that is not known to be reachable at the address it advertises asks up to
`reachability_confirmations` of the nodes it has a connection to (its bootstrap entries, then
its peers) with DIAL_ME(nonce, port); each dials the host that DIAL_ME's connection came from, at
that port, and sends DIALED(nonce, the address it dialled) there, on a connection of its own.
A DIALED that arrives says that its sender reached this node at that address: where a router
forwards the port, that is the router's public address, which the node may not know and its
peers cannot guess.

Asking for a dial-back costs the one asked a connection and a frame, so it is bounded: the dial
goes only to the asker's own host (a stranger cannot aim it at a third party), once per host
per `dial_back_interval_s`, and `max_dial_backs` in all per interval; what is declined is
counted (Membership's counts: a fair request declined is no bad frame). State is bounded too:
the hosts remembered (`MAX_HOSTS`) and the nonces outstanding.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from .subnets import tcp_address

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["Ask", "DialBacks", "NO_SOURCE", "DIAL_BACK_RATE", "DIAL_BACKS_BUSY", "UNEXPECTED_DIALED"]

NO_SOURCE = "dial_back_no_source"  # the asker's host is unknown: there is nowhere to dial
DIAL_BACK_RATE = "dial_back_rate"  # its host was dialled back less than an interval ago
DIAL_BACKS_BUSY = "dial_backs_busy"  # `max_dial_backs` this interval already
UNEXPECTED_DIALED = "unexpected_dialed"  # a DIALED that answers none of our DIAL_MEs
MAX_HOSTS = 1024  # hosts whose last dial-back is remembered (the oldest forgotten first)
ANSWER_WITHIN_S = 30.0  # a DIALED later than this after its DIAL_ME is not counted


@dataclass(frozen=True)
class Ask:
    """Send DIAL_ME(nonce, port) to `address`."""

    address: str
    nonce: int
    port: int


class DialBacks:
    """Both sides: the dial-backs this node gives (`requested`), bounded, and those it asks for
    (`due`, `answered`). `asks`: how many nodes it asks each time; the first time at `first_at`,
    then again after twice as long each time until one answers (a DIAL_ME sent while the
    connection was still opening is lost), at most `interval_s` apart."""

    def __init__(self, interval_s: float, max_dial_backs: int, *, asks: int, first_at: float, now: float) -> None:
        self.interval_s, self.max_dial_backs, self.asks = interval_s, max_dial_backs, asks
        self._retry_s = max(first_at - now, 0.5)
        self._dialled_host: OrderedDict[str, float] = OrderedDict()  # host → when we dialled it back
        self._dialled: deque[float] = deque()  # when each dial-back of the interval went out
        self._outstanding: OrderedDict[int, tuple[str, float]] = OrderedDict()  # nonce → (asked, when)
        self._next_ask_at = first_at

    # --- asked by others -------------------------------------------------------------------

    def requested(self, source: str | None, port: int, now: float) -> tuple[str | None, str | None]:
        """Someone whose connection comes from host `source` asks to be dialled back at `port`:
        (the address to dial, None), or (None, why not)."""
        try:
            address = tcp_address(source, port) if source else None
        except ValueError:
            address = None
        if address is None:
            return None, NO_SOURCE
        last = self._dialled_host.get(source)
        if last is not None and now - last < self.interval_s:
            return None, DIAL_BACK_RATE
        while self._dialled and now - self._dialled[0] >= self.interval_s:
            self._dialled.popleft()
        if len(self._dialled) >= self.max_dial_backs:
            return None, DIAL_BACKS_BUSY
        self._dialled.append(now)
        self._dialled_host[source] = now
        self._dialled_host.move_to_end(source)
        while len(self._dialled_host) > MAX_HOSTS:
            self._dialled_host.popitem(last=False)
        return address, None

    # --- asking --------------------------------------------------------------------------

    @property
    def next_ask_at(self) -> float:
        return self._next_ask_at

    def due(self, now: float, targets: list[str], port: int, nonces: list[int]) -> list[Ask]:
        """What to ask now: every `interval_s`, up to `asks` of `targets` (addresses of nodes
        this node reaches), each with a fresh nonce from `nonces` (random, unguessable)."""
        if now < self._next_ask_at or not targets:
            return []
        self._next_ask_at = now + min(self._retry_s, self.interval_s)
        self._retry_s *= 2
        asks = [Ask(address, nonce, port) for address, nonce in zip(targets[: self.asks], nonces, strict=False)]
        for ask in asks:
            self._outstanding[ask.nonce] = (ask.address, now)
        while len(self._outstanding) > 4 * self.asks:
            self._outstanding.popitem(last=False)
        return asks

    def answered(self, nonce: int, now: float) -> bool:
        """A DIALED with `nonce`: whether it answers one of our DIAL_MEs (each counts once)."""
        asked = self._outstanding.pop(nonce, None)
        if asked is None or now - asked[1] > ANSWER_WITHIN_S:
            return False
        self._retry_s = self.interval_s  # answered: from now on once an interval
        return True
