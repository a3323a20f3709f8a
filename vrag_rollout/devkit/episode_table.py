"""The table a rollout command prints: one line per sample, then the batch's rollout metrics."""

from __future__ import annotations

from typing import Any


def print_summary(output: Any, regions: bool = False) -> None:
    """One line per sample (its document, ending, turns, actions, the calls answered with an
    error (`fail`: the retriever's faults and the requests it refused, e.g. a page past the
    document's end), response and observation tokens, pages shown), then the batch's rollout
    metrics. With `regions` (the region action on) a `crop` column counts each sample's crops,
    and each crop's region follows its pages, as fractions of the page: `crops [x1,y1,x2,y2]`."""
    batch, columns = output.batch, output.non_tensor_batch
    crop_head = f" {'crop':>4}" if regions else ""
    print(f"{'#':>3} {'doc':<16} {'end':<10} {'turns':>5} {'srch':>4} {'ftch':>4} {'fail':>4}{crop_head} {'resp':>5} {'obs':>5}  pages")
    for row, doc in enumerate(columns["doc_id"]):
        used = int(batch["response_mask"][row].sum())
        sampled = int(batch["loss_mask"][row].sum())
        pages = ",".join(page for turn in columns["page_ids"][row] for page in turn) or "-"
        crops = f" {int(columns['num_crops'][row]):>4}" if regions else ""
        failed = int(columns["retriever_errors"][row]) + int(columns["bad_requests"][row])
        print(
            f"{row:>3} {str(doc):<16} {columns['termination_reason'][row]:<10} {int(columns['num_turns'][row]):>5} "
            f"{int(columns['num_searches'][row]):>4} {int(columns['num_fetches'][row]):>4} {failed:>4}{crops} {used:>5} "
            f"{used - sampled:>5}  {pages}{_crop_regions(columns['image_regions'][row]) if regions else ''}"
        )
    metrics = output.meta_info.get("metrics", {})
    keys = ("rollout/turns_mean", "rollout/searches", "rollout/fetches") + (("rollout/crops",) if regions else ())
    keys += ("rollout/retriever_errors", "rollout/bad_requests", "rollout/seconds")
    print("  ".join(f"{key.split('/')[-1]}={metrics.get(key, 0):.2f}" for key in keys))


def _crop_regions(image_regions: Any) -> str:
    """`  crops [x1,y1,x2,y2] ...` for the crops among a sample's images (None: a whole page)."""
    boxes = [f"[{','.join(f'{v:.2f}' for v in region)}]" for region in image_regions if region is not None]
    return f"  crops {' '.join(boxes)}" if boxes else ""
