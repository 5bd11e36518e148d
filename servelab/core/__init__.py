"""Core types shared by every policy and executor: requests, KV blocks, step plans."""
