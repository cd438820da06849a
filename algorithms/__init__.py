"""Learning logic: models, losses, graph learning, datasets and algorithm step functions.

Pure: no sockets, no clocks, no threads. The daemon (p2pnode/) and the simulator
(testnet/simulation/) drive the same functions.
"""
