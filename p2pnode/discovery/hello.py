"""What this node's HELLO says about it: where to reach it and what it does."""

from __future__ import annotations

from protocol import PROTOCOL_VERSION, Hello

from .capabilities import learning_capability

__all__ = ["capabilities", "own_hello"]


def capabilities(
    configured: tuple[str, ...], algorithm: str, labels: tuple[str, ...], roles: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """What HELLO announces: the configured tokens ([node].capabilities), the algorithm this
    node learns with and, with its own data, the fingerprint of its class list (`labels`), and
    its roles in reaching others (`client`, `relay`: protocol/messages.py)."""
    own = () if algorithm == "none" else (learning_capability(algorithm), *labels)
    return tuple(dict.fromkeys((*configured, *own, *roles)))


def own_hello(address: str, peer_port: int, capabilities: tuple[str, ...]) -> Hello:
    """The body of this node's HELLO: `address` is what peers dial, `peer_port` its peers' socket."""
    return Hello(
        address=address,
        capabilities=capabilities,
        dataset_size=0,
        protocol_versions=(PROTOCOL_VERSION,),
        peer_port=peer_port,
    )
