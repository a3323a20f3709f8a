"""The table a rollout command prints: one line per sample, then the batch's rollout metrics."""

from __future__ import annotations

from typing import Any


def print_summary(output: Any, regions: bool = False) -> None:
    """One line per sample (its document, ending, turns, actions, the calls answered with an
    error (`fail`: the retriever's faults and the requests it refused, e.g. a page past the
    document's end), response and observation tokens, pages shown), then the batch's rollout
    metrics. A batch scored against its questions' ground truths (`reward` column) adds each
    episode's reward (overall) and its answer (`answer` column). A question searching the whole
    corpus shows `(corpus)` as its document. With `regions` (the region action on) a `crop` column counts each sample's crops,
    and each crop's region follows its pages, as fractions of the page: `crops [x1,y1,x2,y2]`.
    A segmented batch (context edits) numbers a row `episode.row`; a row an edit closed ends
    `edit` and shows no reward or answer (its episode is scored by its last row)."""
    batch, columns = output.batch, output.non_tensor_batch
    crop_head = f" {'crop':>4}" if regions else ""
    scored = "reward" in columns  # scored against the questions' ground truths (`demo.add_truths_and_rewards`)
    score_head = f" {'reward':>6} {'answer':<24}" if scored else ""
    print(f"{'#':>3} {'doc':<16} {'end':<10} {'turns':>5} {'srch':>4} {'ftch':>4} {'fail':>4}{crop_head} {'resp':>5} "
          f"{'obs':>5}{score_head}  pages")
    episodes, segments = columns.get("episode_id"), columns.get("segment_index")
    for row, doc in enumerate(columns["doc_id"]):
        label = str(row) if episodes is None else f"{int(episodes[row])}.{int(segments[row])}"
        edited = columns["termination_reason"][row] == "context_edit"
        used = int(batch["response_mask"][row].sum())
        sampled = int(batch["loss_mask"][row].sum())
        pages = ",".join(page for turn in columns["page_ids"][row] for page in turn) or "-"
        crops = f" {int(columns['num_crops'][row]):>4}" if regions else ""
        failed = int(columns["retriever_errors"][row]) + int(columns["bad_requests"][row])
        score = (f" {'-':>6} {'-':<24}" if edited else
                 f" {float(columns['reward'][row]['overall']):>6.3f} {_answer(columns.get('answer'), row):<24}"
                 ) if scored else ""
        print(
            f"{label:>3} {'(corpus)' if doc is None else str(doc):<16} "
            f"{'edit' if edited else columns['termination_reason'][row]:<10} "
            f"{int(columns['num_turns'][row]):>5} {int(columns['num_searches'][row]):>4} "
            f"{int(columns['num_fetches'][row]):>4} {failed:>4}{crops} {used:>5} {used - sampled:>5}{score}  "
            f"{pages}{_crop_regions(columns['image_regions'][row]) if regions else ''}"
        )
    metrics = output.meta_info.get("metrics", {})
    keys = ("rollout/turns_mean", "rollout/searches", "rollout/fetches") + (("rollout/crops",) if regions else ())
    keys += ("rollout/retriever_errors", "rollout/bad_requests", "rollout/seconds")
    print("  ".join(f"{key.split('/')[-1]}={metrics.get(key, 0):.2f}" for key in keys))


def _crop_regions(image_regions: Any) -> str:
    """`  crops [x1,y1,x2,y2] ...` for the crops among a sample's images (None: a whole page)."""
    boxes = [f"[{','.join(f'{v:.2f}' for v in region)}]" for region in image_regions if region is not None]
    return f"  crops {' '.join(boxes)}" if boxes else ""


def _answer(column: Any, row: int, width: int = 24) -> str:
    """The episode's answer, quoted and cut to `width` characters; `-` without one."""
    answer = None if column is None else column[row]
    if answer is None:
        return "-"
    text = " ".join(str(answer).split())
    quoted = f'"{text}"'
    return quoted if len(quoted) <= width else quoted[: width - 2] + '…"'
