"""The verifications in flight: whom this node dials and challenges, within which budgets, how
often it retries, and whom it gave up on. No I/O: `Dials.step` returns what to send."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from protocol import Envelope, Ping, Pong

from .actions import Action, Dial, Direct, Hangup, Informant, Send, SendHello, Unreachable
from .peer import Peer
from .settings import DiscoverySettings
from .subnets import Subnets, host_of

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

STRANGERS = 256  # each bounded memory of strangers' keys keeps the latest this many


@dataclass
class Dialing:
    """A verification in flight: the address dialled, the challenge sent there."""

    address: str
    permanent: bool  # a bootstrap address: retried forever
    key: bytes | None  # the key expected there, when learned from a signed HELLO
    informant: Informant  # who told us: a relaying peer's key, the HELLO's sender itself, "beacon", "bootstrap"
    nonce: int
    next_at: float
    delay: float
    since: float  # when the first dial was due
    hello: tuple[Envelope, bytes] | None = None  # the signed HELLO that named this address
    attempts: int = 0
    opened: bool = False  # the outbound connection has been asked for
    owed_pong: int | None = None  # its challenge, answered right after our next HELLO there
    answered: bool = False  # we answered its challenge
    hello_out: bool = False  # our latest HELLO there was queued (not dropped: the connection was up)
    committed: bool = False  # we answered its challenge: it admits us, so we admit it (see Room.welcome)
    full: tuple[Envelope, bytes] | None = None  # verified, no room: redirected once it challenged us


class Dials(Mapping[str, Dialing]):
    """The verifications in flight, by address. It reads the peer table (a connection a peer
    still uses is not hung up) and adds to the membership's `counts`; it changes neither."""

    def __init__(
        self, settings: DiscoverySettings, subnets: Subnets, peers: Mapping[bytes, Peer], counts: Counter[str]
    ) -> None:
        self.settings = settings
        self._subnets = subnets
        self._peers = peers
        self._counts = counts
        self._entries: dict[str, Dialing] = {}
        # Key -> timestamp of the HELLO we gave up dialling: only a newer one is worth a new try.
        self._given_up: dict[bytes, int] = {}
        # Keys we found no room with, both of us full (latest STRANGERS): their HELLOs are not
        # verified again before the time noted, or each one's retry starts the other's anew.
        self._full_until: OrderedDict[bytes, float] = OrderedDict()

    def __getitem__(self, address: str) -> Dialing:
        return self._entries[address]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self, address: str, *, permanent: bool, key: bytes | None, informant: Informant, nonce: int, now: float
    ) -> Dialing:
        """Verify `address`, first dialled at `now`, with the challenge `nonce`."""
        entry = Dialing(
            address,
            permanent,
            key,
            informant,
            nonce=nonce,
            next_at=now,
            delay=self.settings.dial_retry_initial_s,
            since=now,
        )
        self._entries[address] = entry
        return entry

    def drop(self, address: str) -> None:
        self._entries.pop(address, None)

    def admitted(self, entry: Dialing, key: bytes) -> None:
        """`key` was admitted through `entry`: that verification and the others of that key are
        done (a bootstrap address stays, for rejoining)."""
        for address, other in list(self._entries.items()):
            if other is entry or (other.key == key and not other.permanent):
                del self._entries[address]

    def for_key(self, key: bytes) -> Dialing | None:
        return next((entry for entry in self._entries.values() if entry.key == key), None)

    def for_nonce(self, nonce: int) -> Dialing | None:
        return next((entry for entry in self._entries.values() if entry.nonce == nonce), None)

    @property
    def learned(self) -> list[Dialing]:
        """The verifications of addresses learned (not bootstrap ones): each may become a peer."""
        return [entry for entry in self._entries.values() if not entry.permanent]

    @property
    def committed(self) -> int:
        """How many we answered the challenge of: each admits us, so we keep a place for it."""
        return sum(entry.committed for entry in self._entries.values())

    @property
    def joining(self) -> bool:
        """A bootstrap address is being dialled."""
        return any(entry.permanent for entry in self._entries.values())

    def gave_up_on(self, hello: Envelope) -> bool:
        """`hello` is no newer than the one we last gave up verifying."""
        return hello.timestamp_us <= self._given_up.get(hello.sender, -1)

    def full_with(self, key: bytes, now: float) -> bool:
        """`key` and this node found no room with each other a moment ago."""
        return self._full_until.get(key, -math.inf) > now

    def hello_sent(self, address: str, ok: bool) -> None:
        """Outcome of a SendHello (`Membership.hello_sent`)."""
        entry = self._entries.get(address)
        if entry is not None:
            entry.hello_out = ok
            if ok and entry.committed:
                entry.owed_pong = None  # it followed that HELLO (`step`)
            else:
                self._counts["hello_not_sent"] += 1  # and the node sends nothing after it there

    def release(self, address: str, *, flush: bool = False) -> list[Action]:
        """Hang up `address`, unless a peer or a verification still uses that connection."""
        in_use = any(peer.address == address for peer in self._peers.values()) or address in self._entries
        return [] if in_use else [Hangup(address, flush=flush)]

    def stop(self, entry: Dialing) -> list[Action]:
        self.drop(entry.address)
        return self.release(entry.address)

    def over_budget(self, address: str, informant: Informant) -> str | None:
        """Why verifying `address`, told by `informant`, would exceed a dial budget, or None."""
        s = self.settings
        learned = self.learned
        if len(learned) >= s.max_dialing:
            return "dial_budget_full"
        if isinstance(informant, bytes) and sum(e.informant == informant for e in learned) >= s.dialing_per_informant:
            return "dial_budget_informant"
        of_host = self._subnets.of_host
        source = of_host(informant.source) if isinstance(informant, Direct) else None
        if source is not None:
            # Strangers' own HELLOs: a few at once per source subnet (its keys cost it nothing),
            # and never more than half of the budget, so addresses relayed by peers get room.
            # Exempt sources (loopback: this very host) are trusted as the subnet limits trust them.
            direct = [e for e in learned if isinstance(e.informant, Direct) and of_host(e.informant.source)]
            if len(direct) >= s.max_dialing // 2:
                return "dial_budget_direct"
            if sum(of_host(e.informant.source) == source for e in direct) >= s.dialing_per_informant:
                return "dial_budget_source"
        # Dialling back the host a HELLO came from reflects nothing onto anyone else.
        dialling_back = isinstance(informant, Direct) and host_of(address) == informant.source
        subnet = self._subnets.of(address)
        if (
            not dialling_back
            and subnet is not None
            and sum(self._subnets.of(e.address) == subnet for e in learned) >= s.dialing_per_subnet
        ):
            return "dial_budget_subnet"
        return None

    def step(self, entry: Dialing, now: float, *, enough: bool) -> list[Action]:
        """The dial at `entry` is due: open the connection, (re)send HELLO and the challenge
        there, or give up. `enough`: this node has its target of peers."""
        if entry.permanent and enough:
            return self.stop(entry)  # enough peers: the bootstrap is for joining, or rejoining
        if entry.answered and not entry.committed and entry.attempts >= 2 and not entry.permanent:
            # We hold its challenge (no room) and it has not answered ours twice: it holds ours
            # too, for the same reason. Neither wants the other: let go, for a while.
            self._counts["gave_up_full"] += 1
            if entry.key is not None:
                self._full_until[entry.key] = now + self.settings.dial_retry_max_s
                self._full_until.move_to_end(entry.key)
                while len(self._full_until) > STRANGERS:
                    self._full_until.popitem(last=False)
            return self.stop(entry)
        if not entry.opened:
            # A new connection refuses frames until ZeroMQ's handshake is done (IMMEDIATE=1):
            # open it now, send HELLO and the challenge one retry interval later.
            entry.opened = True
            entry.next_at = now + entry.delay
            return [Dial(entry.address, entry.key)]
        if not entry.permanent and entry.attempts >= self.settings.dial_attempts:
            self._counts["gave_up"] += 1
            if entry.key is not None and entry.hello is not None:
                if len(self._given_up) >= 4 * self.settings.max_peers:
                    self._given_up.clear()  # bounded; forgetting only costs a few more HELLOs
                self._given_up[entry.key] = entry.hello[0].timestamp_us
            return self.stop(entry)
        return self._challenge(entry, now)

    def _challenge(self, entry: Dialing, now: float) -> list[Action]:
        """(Re)send HELLO and the challenge to `entry.address`, and schedule the next try."""
        actions: list[Action] = []
        if entry.permanent and entry.attempts == self.settings.dial_attempts:
            self._counts["bootstrap_unreachable"] += 1
            actions.append(Unreachable(entry.address, entry.attempts, now - entry.since, entry.delay))
        entry.attempts += 1
        entry.next_at = now + entry.delay
        entry.delay = min(entry.delay * 2, self.settings.dial_retry_max_s)
        actions += [
            Dial(entry.address, entry.key),
            SendHello(entry.address),
            Send((entry.address,), Ping(nonce=entry.nonce)),
        ]
        if entry.owed_pong is not None and entry.committed:  # owed until `hello_sent` says our HELLO went out
            actions.append(Send((entry.address,), Pong(nonce=entry.owed_pong)))
        return actions
