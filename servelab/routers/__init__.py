"""Cluster-level routers (global schedulers), one module per design; each registers in ROUTERS."""
