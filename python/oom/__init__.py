"""oom: offload-optimized full-parameter MoE training, from Python.

Specs, plan search, simulation, baselines, validation, traces and what-if studies (the C++
extension oom._oom, python/module.cc), the plotting helpers (oom.plots), and the data the project
ships (configs/, experiments/, traces/paper/: oom.data_path). Installed (pip install, or
cmake --install) the package finds its own copy of that data; in a build tree
(PYTHONPATH=BUILD/python) it reads the source tree's. $OOM_CONFIG_DIR, when set, names the configs
folder.
"""
import os as _os
from pathlib import Path as _Path

from . import _oom
from ._oom import *  # noqa: F401,F403  (the module's functions: model, search_plan, simulate, whatif, ...)


def _installed_data():
    """share/oom inside the package (a wheel), or PREFIX/share/oom (cmake --install puts the
    package in PREFIX/lib/pythonX.Y/site-packages/oom)."""
    here = _Path(__file__).resolve().parent
    candidates = [here / "share" / "oom"]
    if len(here.parents) > 3:
        candidates.append(here.parents[3] / "share" / "oom")
    for c in candidates:
        if (c / "configs").is_dir():
            return c
    return None


_data = _installed_data()
if _data is not None:
    _oom._set_data_root(str(_data))

#: The project's version ("0.1.0"); oom.version_text() adds the commit ("0.1.0+04ebad5c1234").
__version__ = _oom.__version__

def __getattr__(name):
    """oom.plots on first use: `import oom` (and the `oom` command's launcher) needs no matplotlib."""
    if name == "plots":
        import importlib

        return importlib.import_module(".plots", __name__)
    raise AttributeError(f"module 'oom' has no attribute {name!r}")


def data_path(*parts):
    """A path under the shipped data: data_path("experiments", "paper") or
    data_path("traces", "paper", "paper-calibration.jsonl")."""
    return _os.path.join(_oom.data_root(), *parts)
