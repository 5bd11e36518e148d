"""``servelab reproduce alignedserve``: the paper's claims in the simulator (and Figure 1's
trend measured on the CPU engine)."""
