"""Figure plumbing shared by the reproductions: matplotlib on the Agg backend, imported only when a
figure is drawn (``servelab --help`` and the simulator never load it), and one way to save a
figure with its provenance line (simulated: which cost model, GPU, model; or measured: which
machine) in the corner, so a plot copied out of its report still says what it shows.
"""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, *, note: str | None = None, dpi: int = 110, note_y: float = 0.01,
         rect: tuple[float, float, float, float] | None = None) -> str:
    """Save ``fig`` to ``path`` (its folder made if needed), close it, return the file name.

    ``note``: the provenance line, bottom right in small grey type; ``rect``: the area
    ``tight_layout`` may use (default: all of it, less a strip for the note)."""
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if note is not None:
        fig.text(0.99, note_y, note, ha="right", va="bottom", fontsize=6, color="dimgray")
    if rect is None and note is not None:
        rect = (0, 0.03, 1, 1)
    if rect is None:
        fig.tight_layout()
    else:
        fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path.name
