"""What `vrag-rollout learn` leaves for a person: the reward curve as a picture and as one line.

`plot_rewards(records, path)` draws every step's mean reward (points), its moving average over
`smoothing_window(len(records))` steps (line) and the accuracy part (faint line), with matplotlib's
file-only backend; `summary_line` prints `training.learn.reward_summary`.
"""

from __future__ import annotations

from gettext import ngettext
from pathlib import Path
from typing import Mapping, Sequence


def smoothing_window(steps: int) -> int:
    """About a tenth of the run, at least 1 step, odd so the average is centred."""
    window = max(1, steps // 10)
    return window if window % 2 else window + 1


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average; near the ends it averages the steps that exist."""
    half = window // 2
    return [sum(values[max(0, i - half):i + half + 1]) / len(values[max(0, i - half):i + half + 1])
            for i in range(len(values))]


def plot_rewards(records: Sequence[Mapping[str, float]], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window: runs on machines without a display
    import matplotlib.pyplot as plt

    steps = [int(r["step"]) for r in records]
    rewards = [float(r["reward_mean"]) for r in records]
    window = smoothing_window(len(records))
    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    axes.plot(steps, rewards, "o", markersize=3, color="tab:blue", alpha=0.5, label="reward per step (batch mean)")
    axes.plot(steps, moving_average(rewards, window), color="tab:blue", linewidth=2,
              label=f"moving average ({_steps(window)})")
    if "reward_accuracy" in records[0]:
        axes.plot(steps, moving_average([float(r["reward_accuracy"]) for r in records], window), color="tab:green",
                  linewidth=1, alpha=0.7, label="accuracy part (moving average)")
    axes.set_xlabel("GRPO step")
    axes.set_ylabel("reward")
    axes.set_ylim(0, 1.05)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    if title:
        axes.set_title(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path)
    plt.close(figure)
    return path


def summary_line(summary: Mapping[str, float]) -> str:
    """`reward over the first 10 steps 0.605, over the last 10 0.930 (gain +0.325, 40 steps)`;
    singular nouns for one step: `over the first step`, `(gain +0.100, 1 step)`."""
    window = int(summary["window"])
    first = "step" if window == 1 else _steps(window)
    last = "step" if window == 1 else str(window)
    return (f"reward over the first {first} {summary['first']:.3f}, over the last {last} {summary['last']:.3f} "
            f"(gain {summary['gain']:+.3f}, {_steps(int(summary['steps']))})")


def _steps(count: int) -> str:
    return f"{count} {ngettext('step', 'steps', count)}"


__all__ = ["moving_average", "plot_rewards", "smoothing_window", "summary_line"]
