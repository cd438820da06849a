"""Programs that exercise the other packages: benchmarks and demos. May import every package;
only the CLI imports it."""
