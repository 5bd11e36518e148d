"""``servelab reproduce dynaserve``: the paper's tables and figures in the simulator."""
