"""Replica-level scheduling policies, one module per design; each registers itself in POLICIES."""
