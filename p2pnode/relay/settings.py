"""[relay]: whether this node forwards for client nodes, and how much; how many relays a client holds."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import CheckContext, Flag, Integer, Number, Section, option


@dataclass(frozen=True, kw_only=True)
class RelaySettings(Section):
    enabled: bool = option(
        Flag(),
        False,
        "hold reservations for client nodes among this node's peers (a node others can dial only; "
        "its HELLO announces the capability `relay`)",
    )
    reservation_ttl_s: float = option(
        Number(10, 86400), 600.0, "the longest a reservation is granted for; the holder renews it halfway"
    )
    max_reservations: int = option(Integer(1, 4096), 128, "reservations held at once, over every holder")
    max_reservations_per_subnet: int = option(
        Integer(1, 4096),
        8,
        "reservations held at once for nodes of one subnet (/24 or /64, a client node in its connection's; "
        "[discovery].subnet_limits_exempt as for peers; libp2p's relays give one IP address 8): many keys behind "
        "one address get this many, not one each",
    )
    max_circuits: int = option(Integer(1, 65536), 256, "circuits (one origin, one target) open at once")
    max_circuits_per_peer: int = option(
        Integer(1, 4096),
        8,
        "circuits one origin opens at once (at the bound, its oldest one never answered is closed for a new one)",
    )
    circuit_rate: float = option(
        Number(1024, 1 << 30),
        float(1 << 20),
        "bytes a second one circuit may forward (in bursts of a second's worth, at least max_frame_bytes)",
    )
    total_rate: float = option(
        Number(1024, 1 << 34),
        float(8 << 20),
        "bytes a second the relay forwards in all (in bursts of a second's worth)",
    )
    max_frame_bytes: int = option(
        Integer(1024, 4 << 20), 1 << 20, "the largest sealed frame forwarded (MAPL-Dual's small model: 97 KB)"
    )
    circuit_idle_s: float = option(Number(1, 3600), 60.0, "a circuit that forwarded nothing this long is closed")
    reservations: int = option(
        Integer(0, 4),
        2,
        "on a client node ([node].client_mode): the relays among its peers it holds a reservation at; 0: none",
    )
    retry_s: float = option(
        Number(1, 3600), 30.0, "on a client node: how long a relay that refused, or did not answer, is left alone"
    )

    def check(self, context: CheckContext) -> list[str]:
        problems = []
        pairs = (("max_reservations_per_subnet", "max_reservations"), ("max_circuits_per_peer", "max_circuits"))
        for part, whole in pairs:
            if getattr(self, part) > getattr(self, whole):
                problems.append(
                    f"[relay].{part}: must not exceed {whole} ({getattr(self, whole)}), got {getattr(self, part)}"
                )
        return problems
