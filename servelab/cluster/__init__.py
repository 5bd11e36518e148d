"""Cluster layer: which instances exist, their roles and policies, the router, the links."""
