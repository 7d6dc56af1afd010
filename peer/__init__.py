"""The running system: peer node, coordinator, round math, model + data, CLI."""

VERSION = "0.1.0"
