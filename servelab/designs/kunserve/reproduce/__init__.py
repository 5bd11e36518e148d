"""``servelab reproduce kunserve``: the paper's claims in the simulator (see run.py)."""
