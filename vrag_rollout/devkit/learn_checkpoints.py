"""`learn`'s checkpoints and its TensorBoard log (I/O around the pure loop, `training/learn.py`).

Contract:
- `save_checkpoint(out_dir, step, hf_model, optimizer, processor)` writes
  `out_dir/checkpoints/step_NNNNN/`: the model in Hugging Face format with its processor (vLLM,
  transformers and `check --model` load it), `optimizer.pt` (AdamW's state) and `step.json`;
  written beside and renamed into place, so a crash never leaves a half checkpoint.
- `latest_checkpoint(out_dir)`: the highest step's directory, or None; `checkpoint_step(dir)` its step.
- `restore(directory, hf_model, optimizer)`: its weights into `hf_model` (in place) and its state
  into `optimizer`; returns the step it was saved after. `learn --resume` then syncs the weights
  into the engine and runs the steps after it; the KL reference stays the run's initial model,
  and sampling continues with fresh draws (a resumed run is not a bit-for-bit replay).
- `TensorBoardLog(out_dir)`: each step's metrics line as scalars (`learn/<field>`) in
  `out_dir/tensorboard/`, the logger EasyR1 and verl offer; `available()` says whether the
  `tensorboard` package is installed (without it, `metrics.jsonl` only).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

CHECKPOINTS = "checkpoints"
OPTIMIZER_FILE = "optimizer.pt"
STEP_FILE = "step.json"


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / CHECKPOINTS / f"step_{step:05d}"


def save_checkpoint(out_dir: Path, step: int, hf_model: Any, optimizer: Any, processor: Any) -> Path:
    import torch

    final = checkpoint_dir(out_dir, step)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    hf_model.save_pretrained(partial)
    processor.save_pretrained(partial)
    torch.save(optimizer.state_dict(), partial / OPTIMIZER_FILE)
    (partial / STEP_FILE).write_text(json.dumps({"step": step}), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


def checkpoint_step(directory: Path) -> int:
    return int(json.loads((Path(directory) / STEP_FILE).read_text())["step"])


def latest_checkpoint(out_dir: Path) -> Optional[Path]:
    found = [path for path in (Path(out_dir) / CHECKPOINTS).glob("step_*")
             if path.is_dir() and (path / STEP_FILE).exists()]
    return max(found, key=checkpoint_step, default=None)


def restore(directory: Path, hf_model: Any, optimizer: Any) -> int:
    import torch
    from transformers import AutoModelForImageTextToText

    saved = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32)
    hf_model.load_state_dict(saved.state_dict())
    optimizer.load_state_dict(torch.load(Path(directory) / OPTIMIZER_FILE, weights_only=True))
    return checkpoint_step(directory)


class TensorBoardLog:
    """Each metrics line as TensorBoard scalars; a no-op without the `tensorboard` package."""

    def __init__(self, out_dir: Path):
        self.directory = Path(out_dir) / "tensorboard"
        self.writer = None
        if available():
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.directory))

    def __call__(self, record: dict) -> None:
        if self.writer is None:
            return
        for name, value in record.items():
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"learn/{name}", float(value), int(record["step"]))
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True
