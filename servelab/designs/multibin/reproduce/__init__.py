"""Multi-Bin Batching reproduction: ``run`` (simulated figures) and ``engine`` (measured)."""
