"""servelab: LLM-serving scheduling and memory designs on one core.

The same policy objects drive a discrete-event cluster simulator (``servelab.simulator``)
and a real PyTorch engine (``servelab.engine``). Importing this package never imports torch.
"""

__version__ = "0.1.0"
