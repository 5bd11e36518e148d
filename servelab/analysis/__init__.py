"""Queueing analysis: Multi-Bin closed forms, service-time distributions, the batch-level queue simulator."""
