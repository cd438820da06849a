"""What a node's HELLO says about its learning, and whether a peer learns together with it:
the same algorithm over the same class list. Capability tokens are plain strings
(`algorithm:NAME`, `labels:FINGERPRINT`) beside the configured ones ([node].capabilities)."""

from __future__ import annotations

import hashlib
import json

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["announced_algorithm", "announced_labels", "labels_capability", "learning_capability", "learning_verdict"]

LABELS_PREFIX = "labels:"
ALGORITHM_PREFIX = "algorithm:"


def learning_capability(algorithm: str) -> str:
    """The HELLO capability of a node that learns with `algorithm`: its learning peers are the
    peers that announce the same one (a node that only relays, or runs something else, is
    neither sent payloads nor waited for). Capability tokens have no '+': mapl+ is mapl.plus."""
    return ALGORITHM_PREFIX + algorithm.replace("+", ".plus")


def labels_capability(class_names: tuple[str, ...]) -> tuple[str, ...]:
    """The HELLO capability of a node with its own data: a fingerprint of the network's class
    list, since payloads are indexed by class id. Learning peers announce the same one (or,
    on benchmark data, none), so nodes whose `[data].class_names` differ never mix classes."""
    if not class_names:
        return ()
    return (LABELS_PREFIX + hashlib.sha256(json.dumps(class_names).encode()).hexdigest()[:16],)


def announced_labels(capabilities: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(token for token in capabilities if token.startswith(LABELS_PREFIX))


def announced_algorithm(capabilities: tuple[str, ...]) -> str | None:
    """The algorithm a peer's HELLO says it learns with (`learning_capability` reversed)."""
    for token in capabilities:
        if token.startswith(ALGORITHM_PREFIX):
            return token.removeprefix(ALGORITHM_PREFIX).replace(".plus", "+")
    return None


def learning_verdict(algorithm: str, labels: tuple[str, ...], capabilities: tuple[str, ...]) -> str | None:
    """Why a peer announcing `capabilities` is not a learning peer of a node that learns with
    `algorithm` over `labels` (its `labels_capability`); None if it is one."""
    theirs = announced_algorithm(capabilities)
    if theirs is None:
        return "runs no learning algorithm"
    if learning_capability(algorithm) not in capabilities:
        return f"learns with {theirs}, this node with {algorithm}"
    other = announced_labels(capabilities)
    if other == labels:
        return None
    if not other:
        return "learns on a benchmark dataset, this node on its own data ([data].path)"
    if not labels:
        return "learns on its own data ([data].path), this node on a benchmark dataset"
    return f"learns over other classes: it announces {', '.join(other)}, this node {', '.join(labels)}"
