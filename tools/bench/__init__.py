"""Benchmarks that print ratios measured within one run (this machine is noisy)."""
