"""Learning on one machine: the model, the data and the inner training loop."""
