"""How the native format resolves crop calls against what the episode was shown (pure, given a
tokenizer): a crop may use pages shown in earlier turns only, since a tool turn's results come back
together after it; a crop without a page takes the last whole page shown before the turn; a crop
image never becomes a page a later crop may name. Oracle: the page fractions computed by hand."""

from __future__ import annotations

from PIL import Image

from vrag_rollout.config import AgentRolloutConfig
from vrag_rollout.core.actions import Crop, Fetch, Search
from vrag_rollout.core.episode import Episode
from vrag_rollout.core.observation import Observation
from vrag_rollout.core.regions import RegionError, RegionRequest
from vrag_rollout.core.tool_turns import ToolCalls
from vrag_rollout.core.vision import PageImage
from vrag_rollout.formats import ToolCallFormat


def page(width=200, height=100) -> PageImage:
    return PageImage(Image.new("RGB", (width, height)), (1, height // 14, width // 14))


def shown(episode: Episode, page_ids, regions=()) -> None:
    images = tuple(page() for _ in page_ids)
    episode.append_sampled([1], [0.0])
    assert episode.append_observation(Observation(engine_ids=(5,), trainer_ids=(5,), images=images,
                                                  page_ids=tuple(page_ids), image_regions=tuple(regions)))


def requests(tiny_processor, episode, *calls):
    fmt = ToolCallFormat(AgentRolloutConfig(action_format="tool_call", region_action=True), tiny_processor.tokenizer)
    return [call.action for call in fmt.requests([(episode, ToolCalls(tuple(calls)))])]


def new_episode() -> Episode:
    return Episode(0, [1, 2], [], "doc", response_length=512, max_images=8)


def test_a_crop_uses_pages_of_earlier_turns(tiny_processor):
    episode = new_episode()
    shown(episode, ["doc_2"])
    (request,) = requests(tiny_processor, episode, Crop(2, (100.0, 200.0, 500.0, 600.0)))
    assert isinstance(request, RegionRequest) and request.page_id == "doc_2"
    assert (request.region.x1, request.region.y1, request.region.x2, request.region.y2) == (0.1, 0.2, 0.5, 0.6)


def test_a_crop_of_a_page_its_own_turn_fetches_is_refused_saying_why(tiny_processor):
    episode = new_episode()
    fetch, crop = requests(tiny_processor, episode, Fetch("image", 3), Crop(3, (0.0, 0.0, 500.0, 500.0)))
    assert fetch == Fetch("image", 3)
    assert isinstance(crop, RegionError) and "from the next turn on" in str(crop)
    (alone,) = requests(tiny_processor, episode, Crop(3, (0.0, 0.0, 500.0, 500.0)))
    assert isinstance(alone, RegionError) and "next turn" not in str(alone)  # no call to blame
    _, after_search = requests(tiny_processor, episode, Search("q"), Crop(None, (0.0, 0.0, 500.0, 500.0)))
    assert isinstance(after_search, RegionError) and "from the next turn on" in str(after_search)


def test_without_a_page_the_last_whole_page_before_the_turn_and_never_a_crop(tiny_processor):
    episode = new_episode()
    shown(episode, ["doc_2", "doc_4"])
    shown(episode, ["doc_4"], regions=[(0.1, 0.1, 0.2, 0.2)])  # a crop of page 4: not a page to name
    assert episode.last_page_id == "doc_4" and len(episode.shown_pages) == 2
    shown(episode, ["doc_2"])
    _, crop = requests(tiny_processor, episode, Fetch("image", 5), Crop(None, (0.0, 0.0, 1000.0, 1000.0)))
    assert isinstance(crop, RegionRequest) and crop.page_id == "doc_2" and crop.page == 2
    assert episode.image_regions == [None, None, [0.1, 0.1, 0.2, 0.2], None]
