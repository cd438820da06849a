"""The algorithms, each a step function over one node's state (algorithms/seam.py's interface):
MAPL and its variants, MAPL-Dual, FedMRL, SFMTL-Graph, SCooL, the baselines, and a Byzantine peer."""
