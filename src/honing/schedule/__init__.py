"""Scheduling: task sampling and the training loop (synchronous now; async strategies later)."""
