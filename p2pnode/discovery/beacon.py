"""Optional LAN beacon: announce this node's signed HELLO by UDP multicast, and hear others'.

For devices with no bootstrap list. A beacon carries a complete signed HELLO frame, so a
listener trusts it exactly as much as a HELLO relayed in PEERS: the key ↔ address binding is
verified, and the address is then dialled like any other. Datagrams larger than a HELLO may be
are dropped unread, and each source address is rate-limited.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Awaitable, Callable

import trio

from ..discovery.settings import BeaconSettings
from ..wire.gate import TokenBuckets

__all__ = ["run_beacon"]

_PER_SOURCE_RATE = 20.0  # datagrams per second from one address
_PER_SOURCE_BURST = 20


def _membership_request(settings: BeaconSettings) -> bytes:
    return struct.pack("4s4s", socket.inet_aton(settings.group), socket.inet_aton(settings.interface))


async def run_beacon(
    settings: BeaconSettings,
    max_bytes: int,
    make_hello: Callable[[], bytes | None],
    on_datagram: Callable[[bytes], Awaitable[None]],
    on_refused: Callable[[str, int], None],
    on_send_failed: Callable[[], None],
) -> None:
    """Send `make_hello()` every interval (none while it returns None) and pass each heard
    datagram to `on_datagram`; datagrams dropped unread go to `on_refused(reason, size)`."""
    listener = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with listener, sender:
        # Every node on the host binds the beacon port; each gets its own copy of a multicast.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await listener.bind(("", settings.port))
        listener.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, _membership_request(settings))
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(settings.interface))
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, settings.ttl)
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)

        async def announce() -> None:
            while True:
                hello = make_hello()
                try:
                    if hello is not None:
                        await sender.sendto(hello, (settings.group, settings.port))
                except OSError:  # no route to the group (interface down): try again later
                    on_send_failed()
                await trio.sleep(settings.interval_s)

        async def listen() -> None:
            buckets = TokenBuckets(_PER_SOURCE_RATE, _PER_SOURCE_BURST, capacity=1024)
            while True:
                data, (host, _) = await listener.recvfrom(max_bytes + 1)
                if len(data) > max_bytes:
                    on_refused("beacon_too_large", len(data))
                elif not buckets.allow(host.encode(), trio.current_time()):
                    on_refused("beacon_rate_limited", len(data))
                else:
                    await on_datagram(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(announce)
            nursery.start_soon(listen)
