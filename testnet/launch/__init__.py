"""Launching real daemons: each node of a run is its own `p2pnode start` process, here or on a
Ray cluster's nodes; the learning and discovery testnets of `p2pnode testnet` are built on it."""
