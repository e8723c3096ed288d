"""docs/performance.png: CPU per run against GPUs, processes, pods and MIG instances."""

from pathlib import Path
from typing import Dict, List, Optional

PANELS = [("GPUs", "linear"), ("processes", "log"), ("pods", "linear"), ("MIG instances", "linear")]


def write(curves: Dict[str, Dict[str, List[float]]], path: Path) -> Optional[str]:
    """Draw the four panels; the reason when it cannot (matplotlib comes with the `bench` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: files only
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    figure, axes = plt.subplots(2, 2, figsize=(10, 7))
    for axis, (panel, scale) in zip(axes.flat, PANELS):
        curve = curves.get(panel)
        if curve:
            axis.plot(curve["x"], curve["total"], "o-", label="with the simulated driver")
            axis.plot(curve["x"], curve["own"], "s-", label="the check's own")
        axis.set_xscale(scale)
        axis.set_xlabel(panel)
        axis.set_ylabel("CPU ms per run")
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.set_title(f"CPU per run against {panel}")
    axes.flat[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None
