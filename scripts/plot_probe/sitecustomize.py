"""Records what every saved matplotlib figure says, for ``scripts/check_readme.py``.

Active only when ``SERVELAB_PLOT_PROBE`` names a folder (check_readme puts this folder on
``PYTHONPATH`` and sets it): when ``matplotlib.figure`` is first imported, ``Figure.savefig``
is wrapped to write one JSON per saved file into that folder: the file's path, the figure's
suptitle and each axes' title, x and y labels. Nothing else changes; without the variable
this module does nothing.
"""

import os
import sys

_PROBE = os.environ.get("SERVELAB_PLOT_PROBE")


def _record(fig, fname) -> None:
    import hashlib
    import json

    path = os.path.abspath(os.fspath(fname)) if isinstance(fname, (str, os.PathLike)) else repr(fname)
    suptitle = getattr(fig, "_suptitle", None)
    info = {"path": path, "suptitle": suptitle.get_text() if suptitle is not None else "",
            "texts": [t.get_text() for t in fig.texts], "axes": [_axes(ax) for ax in fig.axes]}
    name = hashlib.sha1(path.encode()).hexdigest()[:16] + ".json"
    with open(os.path.join(_PROBE, name), "w") as f:
        json.dump(info, f)


def _axes(ax) -> dict:
    """Title and labels of one axes; a label left empty on an axis shared with a labelled one
    (``sharey``, a twin) is that one's, a twin's title is its panel's, and a text-ticked
    (categorical) axis is said so."""
    def label(axis: str) -> str:
        own = getattr(ax, f"get_{axis}label")()
        if own:
            return own
        shared = getattr(ax, f"get_shared_{axis}_axes")().get_siblings(ax)
        return next((getattr(a, f"get_{axis}label")() for a in shared if getattr(a, f"get_{axis}label")()), "")

    def categorical(axis: str) -> bool:
        import re

        texts = [t.get_text() for t in getattr(ax, f"get_{axis}ticklabels")() if t.get_text()]
        plain = [re.sub(r"\\mathdefault|\\times|[${}^\s]", "", t).replace("\u2212", "-") for t in texts]
        return bool(texts) and not all(re.fullmatch(r"[-+\d.,e]*\d[-+\d.,e]*", t) for t in plain)

    def title(a) -> str:
        return " ".join(t for t in (a.get_title("left"), a.get_title(), a.get_title("right")) if t)

    twins = [a for axis in ("x", "y") for a in getattr(ax, f"get_shared_{axis}_axes")().get_siblings(ax)
             if a is not ax and a.bbox.bounds == ax.bbox.bounds]  # twinx/twiny: the same panel
    return {"title": title(ax) or next((title(a) for a in twins if title(a)), ""),
            "xlabel": label("x"), "ylabel": label("y"), "visible": ax.axison,
            "x_categorical": categorical("x"), "y_categorical": categorical("y")}


def _patch(module) -> None:
    real = module.Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        result = real(self, fname, *args, **kwargs)
        try:
            _record(self, fname)
        except Exception:  # the probe must never break the command it watches
            pass
        return result

    module.Figure.savefig = savefig


class _Finder:
    """A meta-path finder that patches ``matplotlib.figure`` right after it is executed."""

    def find_spec(self, name, path, target=None):
        if name != "matplotlib.figure":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _PROBE and os.path.isdir(_PROBE):
    sys.meta_path.insert(0, _Finder())
