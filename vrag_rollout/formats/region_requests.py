"""A region action resolved against what its episode was shown: shared by both formats. Pure.

`resolved(action, episode, frame, earlier_calls)` is a `RegionRequest` for a crop the episode can
make, the `RegionError` to answer it with otherwise, and any other action as it is.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core.actions import Crop, Fetch, Search
from ..core.episode import Episode
from ..core.regions import RegionError, resolve


def resolved(action: Any, episode: Episode, frame: str, earlier_calls: Sequence[Any] = ()) -> Any:
    """`earlier_calls`: the calls before it in the same turn, whose pages it cannot use yet (the
    error says so)."""
    if not isinstance(action, Crop):
        return action
    try:
        return resolve(action.page, action.box, frame, episode.current_document, episode.shown_pages,
                       episode.last_page_id)
    except RegionError as error:
        if any(isinstance(c, Search) or (isinstance(c, Fetch) and c.modality == "image") for c in earlier_calls):
            return RegionError(f"{error}; a page this turn's own calls show can be cropped from the next turn on")
        return error
