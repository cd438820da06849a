"""Learning on the node: the round driver, the I/O-free round engine and state it drives,
checkpoints, the history file, and using the trained model (predict, export)."""
