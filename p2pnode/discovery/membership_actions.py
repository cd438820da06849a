"""Membership's actions (peers.py) carried out: frames sent, connections dialed and hung up,
replay windows and CURVE keys following who is admitted, and unreachable bootstrap entries
explained from their connections' handshakes. Membership decides; this does."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import trio

from protocol import Body, Hello, ReplayGuard, node_id

from ..wire.transport import MissingKey, Transport, TransportError
from ..wire.zap import PeerTransportKeys
from .actions import Action, Admitted, Dial, DialBack, DialPeers, Evicted, Hangup, Send, SendHello, Unreachable
from .peers import Membership
from .reachability import PRIVATE, UNKNOWN

__all__ = ["MembershipActions"]

log = logging.getLogger("p2pnode.node")


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


class MembershipActions:
    """Carries out a running node's `Membership` actions on its transport. `send(addresses,
    body)` signs and sends a body, returning how many addresses took it; `hello` is the node's
    own HELLO; `lowest_parked_seq(key)` is the gate's; `bootstrap_entries` numbers the
    bootstrap addresses, whose dials are watched so that a wrong key is named as such;
    `dial_back(address, key, nonce)` sends a DIALED on a connection of its own."""

    def __init__(
        self,
        membership: Membership,
        transport: Transport,
        send: Callable[[tuple[str, ...], Body], int],
        hello: Hello,
        guard: ReplayGuard,
        lowest_parked_seq: Callable[[bytes], int | None],
        peer_keys: PeerTransportKeys,
        connections: Counter[str],
        bootstrap_entries: dict[str, int],
        dial_back: Callable[[str, bytes, int], None],
    ) -> None:
        self.membership, self.transport, self.send, self.hello = membership, transport, send, hello
        self.guard, self.lowest_parked_seq, self.peer_keys = guard, lowest_parked_seq, peer_keys
        self.connections = connections  # Metrics.connections
        self.bootstrap_entries = bootstrap_entries
        self.dial_back = dial_back
        self._reachability_said: tuple = (UNKNOWN, ())  # the state last logged, and where dial-backs got through

    def carry_out(self, actions: list[Action]) -> None:
        membership = self.membership
        # Where a HELLO was just dropped (the connection is not up yet, IMMEDIATE=1): the frames
        # that follow it in this batch are not sent, for the connection may come up in between
        # and a frame other than HELLO would open it and be refused (`handshake_first`). A CURVE
        # handshake, which waits for the other side's ZAP handler, made that window likely.
        unready: set[str] = set()
        for action in actions:
            if isinstance(action, Send):
                addresses = tuple(a for a in action.addresses if a not in unready)
                if addresses:
                    self.send(addresses, action.body)
            elif isinstance(action, SendHello):
                sent = self.send((action.address,), self.hello) == 1
                if not sent:
                    unready.add(action.address)
                self.carry_out(membership.hello_sent(action.address, sent, trio.current_time()))
            elif isinstance(action, Dial | DialPeers | Hangup):
                self._connect(action)
            elif isinstance(action, DialBack):
                self.dial_back(action.address, action.key, action.nonce)
            else:
                self._membership_changed(action)
        self._say_reachability()

    def _say_reachability(self) -> None:
        """Log the node's reachability when it becomes known or changes (`status` shows it always)."""
        reachability = self.membership.reachability
        seen = (reachability.state, tuple(reachability.dialled_back.items()))
        if seen == self._reachability_said:
            return
        self._reachability_said = seen
        said = reachability.describe(self.hello.address)
        level = logging.WARNING if said["state"] == PRIVATE else logging.INFO
        log.log(level, "reachability: %s (%s)", said["state"], said["why"], extra={"reachability": said["state"]})

    def count_handshakes(self) -> None:
        """Read the watched dials' handshakes (often enough that libzmq never waits on them) and
        count the failed and refused ones, which `status` shows."""
        for outcomes in self.transport.handshakes().values():
            for outcome in ("failed", "refused"):
                if outcomes[outcome]:
                    self.connections[f"dial_handshake_{outcome}"] += outcomes[outcome]

    def _connect(self, action: Dial | DialPeers | Hangup) -> None:
        try:
            if isinstance(action, Dial):
                self.transport.dial(action.address, action.key, watch=action.address in self.bootstrap_entries)
            elif isinstance(action, DialPeers):
                self.transport.dial_peers(action.address, action.peers_address)
            else:
                self.transport.hangup(action.address, flush=action.flush)
        except MissingKey as exc:
            self.connections["dial_refused_no_key"] += 1
            log.warning("%s", exc)
        except TransportError as exc:
            log.warning("%s", exc)

    def _membership_changed(self, action: Admitted | Evicted | Unreachable) -> None:
        peers, max_peers = len(self.membership.peers), self.membership.settings.max_peers
        if isinstance(action, Admitted):
            # Frames it sent before the PONG that admitted it may be parked: checked once each.
            self.guard.trust(action.key, action.seq, unseen_from=self.lowest_parked_seq(action.key))
            self.peer_keys.track(action.key, admitted=True)
            self.transport.admitted(action.address)
            log.info("peer %s admitted at %s (%d/%d peers)", node_id(action.key), action.address, peers, max_peers)
        elif isinstance(action, Evicted):
            self.guard.forget(action.key)
            self.peer_keys.track(action.key, admitted=False)
            log.info("peer %s evicted (%s; %d/%d peers left)", node_id(action.key), action.why, peers, max_peers)
        elif isinstance(action, Unreachable):
            self._unreachable(action)

    def _unreachable(self, action: Unreachable) -> None:
        """Why a bootstrap entry has not answered, as far as its connection's handshakes tell:
        a node is there with another key (or without CURVE), it refuses this node, it takes this
        node's frames but cannot answer them (this node is out of its reach), or no node answers
        at all."""
        handshakes = self.transport.handshakes_with(action.address)
        entry = f"bootstrap entry {self.bootstrap_entries.get(action.address, '?')}"
        retrying = f"still retrying (next in {action.next_in_s:g} s)"
        extra = {"address": action.address, "attempts": action.attempts, "handshakes": dict(handshakes)}
        if handshakes["failed"] and not handshakes["succeeded"]:
            log.warning(
                "%s: the node at %s has another key (or CURVE off); handshake failed %s in %.1f s; %s "
                "(compare the entry's key with `p2pnode keyinfo` of that node's key, and [security].curve on both)",
                *(entry, action.address, _times(handshakes["failed"]), action.waited_s, retrying),
                extra=extra,
            )
        elif handshakes["refused"] and not handshakes["succeeded"]:
            log.warning(
                "%s: the node at %s refused this node's connection %s in %.1f s (its [security].allowlist "
                "or connection caps); %s",
                *(entry, action.address, _times(handshakes["refused"]), action.waited_s, retrying),
                extra=extra,
            )
        elif handshakes["succeeded"]:
            # Our frames reach it; its answers go to the address our HELLO advertises, and none came.
            self.membership.reachability.unanswered(action.address)
            log.warning(
                "%s: the node at %s accepted this node's connection (handshake succeeded %s) but none of %d "
                "challenges was answered in %.1f s: its answers go to this node's advertised address %s, which "
                "it cannot reach. This node is likely behind a NAT or a firewall: a node must accept connections "
                "at [node].advertise and at its peers' port (a public address or forwarded ports; docs/deploy.md, "
                '"Behind a NAT or a firewall"); %s',
                *(entry, action.address, _times(handshakes["succeeded"]), action.attempts, action.waited_s),
                *(self.hello.address, retrying),
                extra=extra,
            )
        else:
            log.warning(
                "bootstrap %s unreachable: %d challenges unanswered in %.1f s; still retrying (next in %g s; "
                "is a node running there? [discovery].bootstrap)",
                *(action.address, action.attempts, action.waited_s, action.next_in_s),
                extra=extra,
            )
