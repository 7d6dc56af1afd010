"""What every node shares: the typed run config, the round math, checkpoints, progress lines."""
