"""Discrete-event cluster simulator: simulated clock, event heap, deterministic for a seed.

Imports no torch. ``simulate`` is the entry point; see ``servelab.simulator.run``.
"""

from servelab.simulator.run import SimResult, Simulation, simulate

__all__ = ["SimResult", "Simulation", "simulate"]
