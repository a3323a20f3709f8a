"""What `evaluate` says while it runs (pure: each function returns one line, the job prints it).

Contract: `plan_line` before the first batch (questions to roll out, samples each, batches),
`resume_line` when `results.jsonl` already held some of the run's questions, `batch_line` after
each batch: questions done of the run's total, the time so far and, until the last, the time
left at this run's own pace (the questions a resume found done took no time here).
"""

from __future__ import annotations


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 'es' if word.endswith('ch') else 's'}"


def plan_line(questions: int, samples: int, batch_size: int) -> str:
    each = f" ({samples} samples each)" if samples > 1 else ""
    batches = -(-questions // batch_size)
    return f"evaluating {_plural(questions, 'question')}{each} in {_plural(batches, 'batch')} of up to {batch_size}"


def resume_line(done: int, total: int) -> str:
    return f"resuming: {done} of {total} questions done, {total - done} to go"


def batch_line(batch: int, batches: int, *, done: int, total: int, done_before: int, elapsed: float) -> str:
    line = f"batch {batch} of {batches}: {done} of {total} questions done ({elapsed:.0f} s"
    if done < total and done > done_before:
        line += f", about {elapsed / (done - done_before) * (total - done):.0f} s to go"
    return line + ")"
