"""The training peer: setup, round schedule (sync / overlapped), exchange, heartbeat."""
