"""Reporting: what a run adds up to, from the records its nodes wrote (a simulation's, a testnet's
or a deployment's): report.json, report.md, the plots, and what they are drawn from."""
