"""Which subnet an address counts in, for the limits on peers and dials per subnet."""

from __future__ import annotations

import ipaddress

from protocol.messages import is_client_address

from ..wire.gate import subnet_of

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)


def host_of(address: str) -> str:
    """The host of a tcp:// address, without IPv6 brackets."""
    return address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")


def port_of(address: str) -> int:
    """The port of a tcp:// address."""
    return int(address.rsplit(":", 1)[1])


def tcp_address(host: str, port: int) -> str:
    """The tcp:// address of `host` (an IPv4 or IPv6 address: ValueError otherwise) at `port`."""
    return f"tcp://[{host}]:{port}" if ipaddress.ip_address(host).version == 6 else f"tcp://{host}:{port}"


class Subnets:
    """The subnet of a host (a /24 or /64, `subnet_of`), except in the networks `exempt` from the
    limits (`subnet_limits_exempt`)."""

    def __init__(self, exempt: tuple[str, ...]) -> None:
        self._exempt = tuple(ipaddress.ip_network(cidr) for cidr in exempt)

    def of_node(self, address: str, source: str | None) -> str | None:
        """The subnet a node at `address` counts in: its address's; a client node's, whose
        address names no host and is one per key, that of the host its connection came from
        (`source`), so that many keys behind one NAT count as one subnet."""
        if is_client_address(address) and source is not None:
            return self.of_host(source)
        return self.of(address)

    def of(self, address: str) -> str | None:
        """The subnet of an address's host, or None where the limits do not apply (loopback by
        default: all of it is this very host) or the host is a name."""
        return self.of_host(host_of(address))

    def of_host(self, host: str | None) -> str | None:
        if host is None:
            return None
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return f"name:{host}"
        if any(ip in network for network in self._exempt):
            return None
        return subnet_of(host)
