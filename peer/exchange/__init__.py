"""Exchange modes: how the updates of a round meet (peer/exchange/modes.py lists them)."""
