"""Plot a coupled-GRPO run: reward per step (mean and the mean spread within a group), pass and format rates.

    python scripts/rl_plot.py RUN_DIR OUT.png [--title TEXT]

Reads ``RUN_DIR/metrics.jsonl`` (``diffu train --rl coupled-grpo``); a rollout step carries the reward of
the completions made at that step. Needs matplotlib (the ``test`` and ``plot`` extras).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rollouts(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if "reward" in r]


def moving_average(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out.append(sum(part) / len(part))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--title", default="coupled-GRPO")
    p.add_argument("--window", type=int, default=5, help="moving-average window in rollouts (5)")
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="scripts/rl_baseline.py's output: the starting model on the same rollouts, drawn in grey",
    )
    args = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rollouts(args.run_dir)
    if not rows:
        p.error(f"{args.run_dir}/metrics.jsonl holds no rollout yet")
    steps = [r["step"] for r in rows]
    reward = [r["reward"] for r in rows]
    spread = [r["reward_std"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 2))
    top.plot(steps, reward, ".", color="tab:blue", alpha=0.5, label="mean reward of a rollout")
    top.plot(
        steps, moving_average(reward, args.window), color="tab:blue", label=f"moving mean ({args.window})"
    )
    lo = [m - s for m, s in zip(reward, spread, strict=True)]
    hi = [m + s for m, s in zip(reward, spread, strict=True)]
    top.fill_between(steps, lo, hi, color="tab:blue", alpha=0.12, label="mean spread within a group")
    if args.baseline is not None:
        base = [json.loads(x) for x in args.baseline.read_text(encoding="utf-8").splitlines() if x.strip()]
        base.sort(key=lambda r: r["step"])
        b_steps, b_reward = [r["step"] for r in base], [r["reward"] for r in base]
        top.plot(b_steps, b_reward, ".", color="grey", alpha=0.5)
        top.plot(
            b_steps, moving_average(b_reward, args.window), color="grey", label="starting model, same prompts"
        )
        for key, color in (("format_rate", "tab:orange"), ("pass_rate", "tab:green")):
            if base and key in base[0]:
                values = moving_average([r[key] for r in base], args.window)
                label = "starting model (dotted)" if key == "format_rate" else None
                bottom.plot(b_steps, values, color=color, linestyle=":", alpha=0.8, label=label)
    top.set_ylabel("reward (default rewards: at most 2.5)")
    top.legend(loc="upper left", fontsize=8)
    top.set_title(args.title, fontsize=10)
    for key, color, label in (
        ("format_rate", "tab:orange", "format 1.0"),
        ("pass_rate", "tab:green", "all asserts pass"),
    ):
        if key in rows[0]:
            bottom.plot(steps, moving_average([r[key] for r in rows], args.window), color=color, label=label)
    bottom.set_ylabel("share of completions")
    bottom.set_xlabel("step (optimizer updates)")
    if bottom.lines:
        bottom.legend(loc="upper left", fontsize=8)
    else:
        bottom.set_visible(False)  # custom rewards: no pass or format rate
        top.set_xlabel("step (optimizer updates)")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"{len(rows)} rollouts -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
