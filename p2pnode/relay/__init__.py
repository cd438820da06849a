"""Relays (issue #46): a public node forwards for client nodes, which nobody can dial, and a client
node holds reservations at relays (docs/daemon.md, "Relays"; the wire: docs/protocol.md, "Relays")."""
