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
        4,
        "reservations held at once for nodes of one subnet (/24 or /64, a client node in its connection's; "
        "[discovery].subnet_limits_exempt as for peers): many keys behind one address get this many, not one each",
    )
    reservations: int = option(
        Integer(0, 4),
        2,
        "on a client node ([node].client_mode): the relays among its peers it holds a reservation at; 0: none",
    )
    retry_s: float = option(
        Number(1, 3600), 30.0, "on a client node: how long a relay that refused, or did not answer, is left alone"
    )

    def check(self, context: CheckContext) -> list[str]:
        if self.max_reservations_per_subnet > self.max_reservations:
            return [
                f"[relay].max_reservations_per_subnet: must not exceed max_reservations ({self.max_reservations}), "
                f"got {self.max_reservations_per_subnet}"
            ]
        return []
