"""The `swarmloco` verbs: CLI, demo launcher, simulate, status."""
