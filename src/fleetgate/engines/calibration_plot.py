"""PNG of a calibration: predicted vs measured replica seconds per request."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fleetgate.core.calibrate import predicted_seconds

if TYPE_CHECKING:
    from fleetgate.engines.calibration import CalibrationRun


def plot_calibration(run: CalibrationRun, path: Path, title: str = "") -> None:
    """PNG of predicted vs measured replica seconds per request (train and held-out shapes)."""
    from fleetgate.plots import pyplot

    plt = pyplot()

    cal = run.calibration
    measured = [m.replica_seconds * 1000 for m in run.measurements]
    # held-out points as the train-split fit predicted them (the shipped profile has seen them)
    split = cal.split_profile or cal.profile
    predicted = [float(v) * 1000 for v in predicted_seconds(split, run.measurements)]
    fig, ax = plt.subplots(figsize=(5.5, 5.0), dpi=110)
    for idx, label, marker in ((cal.train, "train", "o"), (cal.holdout, "held out", "s")):
        ax.scatter([measured[i] for i in idx], [predicted[i] for i in idx], label=label, marker=marker)
    lo = min([*measured, *predicted]) * 0.9
    hi = max([*measured, *predicted]) * 1.1
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1, linestyle="--", label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured replica ms / request (saturated)")
    ax.set_ylabel("predicted by the train-split MU profile (ms)")
    ax.set_title(
        f"{title or cal.profile.name}\nheld-out R²={cal.r2_holdout:.3f}  MAPE={cal.mape_holdout:.1%}",
        fontsize=10,
    )
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
