"""The algorithms, each a step function over one node's state (the interface of algorithms/interface.py):
MAPL and its variants, MAPL-Dual, FedMRL, SFMTL-Graph, SCooL, the baselines, and a Byzantine peer."""
