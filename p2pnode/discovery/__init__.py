"""Discovery: who this node's peers are (membership, dialing, liveness) and the LAN beacon."""
