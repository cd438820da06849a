"""Testnet harness, in three rooms, each a sub-package:

- `testnet.launch`: real daemons as processes: the learning and discovery testnets (`p2pnode
  testnet`), the launcher (`cluster.py`), where the daemons run (`placement.py`, `raynodes.py`:
  here, forked from a warm parent by `warm_parent.py`, or on a Ray cluster's nodes), churn, and
  a Byzantine daemon for rehearsals.
- `testnet.simulation`: the in-process simulator (`p2pnode simulate`): what a run is (`spec.py`,
  `rehearsal.py`, `own_data.py`), its clock, exchange and shards, and where its hosts run
  (`hosting.py`: inline, worker processes, Ray actors).
- `testnet.reporting`: what a run adds up to: the report builder both of the others feed
  (`report.py`), report.md, the plots, the intervals, the provenance, a deployment's report,
  a node's held-out files, and the overlay a discovery testnet built.

The rooms import downward only: `reporting` imports neither of the others, `simulation` imports
`reporting`, `launch` imports both (the learning testnet runs a simulation's spec and reports as
the simulator does); tests/test_layering.py checks it. `ray_extra.py`, asked by `launch` and
`simulation` alike, stays here, in none.

Arrives with the daemon (issue 3) and learning-core (issue 4) work; in rooms since issue #47.
"""
