"""Testnet harness: launches many real daemons, scenarios, reports, and the in-process simulator.

Arrives with the daemon (issue 3) and learning-core (issue 4) work.
"""
