"""Simulator fidelity: the same workload on the real engine and in the simulator (with the
cost model calibrated on this machine), compared request by request and step by step."""
