"""GRPO against the turn-level estimators on the two-pages credit task, same seeds, on the CPU.

Runs `vrag-rollout learn --task two-pages` (devkit/credit_task.py: two gold pages, each found by a
fetch of its own, among distractor pages) once per (configuration, seed), every run from the same
initial weights on one engine (the weights are synced back before each run), and prints per
configuration the steps each seed took to reach the reward threshold (the first step whose
3-step trailing mean of `reward_mean` reaches it; `-` when it never did) and the mean reward of
the last 5 steps, then writes `credit.png` (mean curve per configuration over the seeds, each
seed faint) and `credit.json` (every run's per-step rewards and the settings).

`reward_mean` is the episode's reward as `core/reward.py` scores it (today's), in every
configuration: the configurations differ only in the per-turn rewards they learn from and the
estimator that turns them into advantages.

    nice -n 10 .venv/bin/python scripts/bench_credit.py --out artifacts/bench_credit [--steps 25 --seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# (label, estimator, turn rewards)
CONFIGS = (("grpo (episode reward)", "grpo", "off"), ("grpo + turn rewards", "grpo", "on"),
           ("turn + turn rewards", "turn", "on"), ("gigpo + turn rewards", "gigpo", "on"))
WINDOW = 3


def steps_to(rewards: list, threshold: float, window: int = WINDOW):
    for step in range(window, len(rewards) + 1):
        if sum(rewards[step - window:step]) / window >= threshold:
            return step
    return None


def plot(runs: dict, path: Path, threshold: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    for color, (label, seeds) in zip(("tab:gray", "tab:blue", "tab:orange", "tab:green"), runs.items()):
        curves = list(seeds.values())
        steps = range(1, len(curves[0]) + 1)
        for curve in curves:
            axes.plot(steps, curve, color=color, alpha=0.2, linewidth=1)
        axes.plot(steps, [sum(c[i] for c in curves) / len(curves) for i in range(len(curves[0]))], color=color,
                  linewidth=2, label=f"{label} (mean of {len(curves)} seeds)")
    axes.axhline(threshold, color="black", linestyle=":", linewidth=1, label=f"threshold {threshold}")
    axes.set_xlabel("step")
    axes.set_ylabel("reward (batch mean)")
    axes.set_ylim(0, 1.05)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize=7)
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench_credit"))
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threshold", type=float, default=0.6)
    parser.add_argument("--configs", nargs="+", default=None,
                        help="configurations to run as ESTIMATOR-TURNREWARDS, e.g. grpo-off turn-on (default all)")
    args = parser.parse_args()

    import copy

    import torch
    from transformers import AutoModelForImageTextToText

    from vrag_rollout.devkit.demo import demo_model
    from vrag_rollout.devkit.learn_job import run_learn
    from vrag_rollout.engine.weights import sync_weights

    model_dir, _ = demo_model(None, None)
    initial = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    settings = dict(steps=args.steps, batch_size=args.batch_size, n=args.n, lr=args.lr, evaluate=False,
                    progress=False, guard="off", task="two-pages", model_dir=model_dir)
    configs = [c for c in CONFIGS if args.configs is None or f"{c[1]}-{c[2]}" in args.configs]
    runs: dict = {label: {} for label, _, _ in configs}
    llm, processor, started = None, None, time.perf_counter()
    for seed in args.seeds:
        for label, estimator, turn_rewards in configs:
            if llm is not None:
                sync_weights(llm, copy.deepcopy(initial))  # every run starts from the same weights
            out = args.out / f"{estimator}-{turn_rewards}-seed{seed}"
            result = run_learn(out, **settings, seed=seed, estimator=estimator, turn_rewards=turn_rewards, llm=llm,
                               processor=processor)
            llm, processor = result["llm"], result["processor"]
            runs[label][seed] = [r["reward_mean"] for r in result["records"]]
            print(f"[{time.perf_counter() - started:6.0f}s] {label:24s} seed {seed}: "
                  + " ".join(f"{x:.2f}" for x in runs[label][seed]), flush=True)

    lines = [f"two-pages task, qwen2-vl tiny, tags, {args.batch_size} questions x n={args.n}, {args.steps} steps, "
             f"lr {args.lr:g}, seeds {args.seeds}; steps to a {WINDOW}-step mean reward >= {args.threshold}:"]
    summary = {}
    for label, seeds in runs.items():
        reached = [steps_to(curve, args.threshold) for curve in seeds.values()]
        last = [sum(curve[-5:]) / len(curve[-5:]) for curve in seeds.values()]
        summary[label] = {"steps_to_threshold": reached, "last5_mean": last}
        lines.append(f"  {label:24s} steps {' '.join(str(s) if s else '-' for s in reached):12s} "
                     f"last-5 reward {' '.join(f'{x:.2f}' for x in last)} (mean {sum(last) / len(last):.3f})")
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "credit.json").write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)},
                                                      "runs": runs, "summary": summary}, indent=1))
    plot(runs, args.out / "credit.png", args.threshold,
         f"two-pages task: {args.batch_size}x{args.n} episodes a step, seeds {args.seeds}")
    print(f"wrote {args.out / 'credit.png'}, {args.out / 'credit.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
