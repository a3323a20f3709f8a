"""What `vrag_agent` takes from verl before it samples: the settings it is built under, the seeds
of rows without a sample index, and the prompt images of verl's dataset.

- Partial rollouts and a grammar: verl's resume loop resubmits an aborted request with the same
  sampling parameters, so a grammar would restart after the partial text. The loop refuses the
  combination when verl builds it, naming both settings, before any request; each setting alone
  is accepted.
- Seeds: verl runs several `AgentLoopWorker` processes (Ray actors), all at dp rank 0, and splits
  a step's n copies of a prompt across them. Trajectories of rows without `vrag_sample` must not
  get the same sample number (hence the same seeds, identical GRPO samples) in two processes.
- Prompt images: verl's `RLHFDataset._build_messages` turns a row's image column into message
  parts of several shapes (a PIL image, a dict with the parquet `bytes`, a path, a dict of a
  path or URL); the loop reads each as the RGB image it shows the model and the trainer.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import os
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from omegaconf import OmegaConf  # noqa: E402
from PIL import Image  # noqa: E402

from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from tests.integrations.partial_rollouts import ResumingClient  # noqa: E402
from tests.rollout.agent_helpers import sample_prompts  # noqa: E402
from vrag_rollout.devkit.demo import demo_config, demo_page_band  # noqa: E402
from vrag_rollout.engine.sampling import request_seed  # noqa: E402
from vrag_rollout.integrations.verl import agent_loop  # noqa: E402
from vrag_rollout.integrations.verl.agent_loop import AGENT_NAME, SAMPLE_COLUMN  # noqa: E402
from vrag_rollout.integrations.verl.images import prompt_images  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker, prompt_rows  # noqa: E402
from vrag_rollout.verify.check import check_batch  # noqa: E402
from vrag_rollout.verify.saved_batch import from_dataproto  # noqa: E402


def settings_for(processor, *, grammar: bool, **overrides) -> dict:
    """The demo rollout's settings: with its grammar (`action_regex` and `first_turn_action_regex`) or without."""
    config = demo_config(**demo_page_band(processor), n=1, retriever_fixtures=str(SAMPLE_RETRIEVAL), **overrides)
    if not grammar:
        config = dataclasses.replace(config, action_regex=None, first_turn_action_regex=None)
    return {k: v for k, v in dataclasses.asdict(config).items() if v is not None}


def build_loop(worker, client, trainer_config=None):
    """The loop as verl's worker builds one for each trajectory (`AgentLoopWorker._run_agent_loop`)."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    config = trainer_config if trainer_config is not None else worker.config
    return hydra.utils.instantiate(
        config=_agent_loop_registry[AGENT_NAME], trainer_config=DictConfigWrap(config), server_manager=client,
        tokenizer=worker.tokenizer, processor=worker.processor, hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls, data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))


REFUSED = r"action_regex and first_turn_action_regex .*async_training\.partial_rollout"


def test_a_grammar_under_verls_partial_rollouts_is_refused_naming_both_settings(tiny_model_dir, tiny_processor,
                                                                                tiny_llm):
    tokenizer = tiny_processor.tokenizer
    worker = local_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor, grammar=True))
    engine = worker.llm_client
    worker.llm_client = ResumingClient(config=worker.config, engine=engine, tokenizer=tokenizer)
    with pytest.raises(Exception, match=REFUSED):  # verl's fully async client: it resubmits aborted requests
        asyncio.run(worker.generate_sequences(prompt_rows(sample_prompts(1, with_images=False), "tags")))
    assert engine.calls == 0  # refused before any request

    partial_on = OmegaConf.merge(worker.config, {"async_training": {"partial_rollout": True}})
    with pytest.raises(Exception, match=REFUSED):  # the fully async trainer's setting, whatever the client
        build_loop(worker, engine, partial_on)
    partial_off = OmegaConf.merge(worker.config, {"async_training": {"partial_rollout": False}})
    build_loop(worker, ResumingClient(config=partial_off, engine=engine, tokenizer=tokenizer), partial_off)
    build_loop(worker, engine)  # the grammar on a server that never resumes

    only_first = {**settings_for(tiny_processor, grammar=False),
                  "first_turn_action_regex": demo_config().first_turn_action_regex}
    worker = local_worker(tiny_model_dir, tiny_llm, only_first)
    with pytest.raises(Exception, match=r"vrag_agent: first_turn_action_regex \(a grammar"):
        build_loop(worker, ResumingClient(config=worker.config, engine=engine, tokenizer=tokenizer))
    worker = local_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor, grammar=False))
    build_loop(worker, ResumingClient(config=worker.config, engine=engine, tokenizer=tokenizer))  # no grammar


# ---- seeds of rows without a sample index ----

def forked(function):
    """`function()` in a forked copy of this process (its result, an int)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, answer, leave without running the parent's cleanup
        try:
            os.write(write, str(function()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        return int(os.read(read, 64))
    finally:
        os.close(read)
        os.waitpid(pid, 0)


@pytest.mark.process
def test_worker_processes_never_give_two_trajectories_the_same_seeds():
    # Each Ray worker process imports the module afresh: two fresh numberings stand for two workers.
    fresh = [agent_loop._TrajectoryNumbers().next() for _ in range(2)]
    agent_loop.trajectory_number()
    child = forked(agent_loop.trajectory_number)  # a process forked from one that had numbered trajectories
    parent = agent_loop.trajectory_number()
    numbers = [*fresh, child, parent]
    assert len(set(numbers)) == len(numbers), numbers
    assert min(numbers) >= agent_loop.ROW_SAMPLES  # above every row-given index
    seeds = {request_seed(1, 0, number, turn) for number in numbers for turn in range(2)}
    assert len(seeds) == 2 * len(numbers)


class SeedRecorder:
    """The engine's server, recording each request's seed."""

    def __init__(self, engine):
        self.engine, self.seeds = engine, []

    async def generate(self, request_id, *, sampling_params, **kwargs):
        self.seeds.append(sampling_params.get("seed"))
        return await self.engine.generate(request_id, sampling_params=sampling_params, **kwargs)


def test_a_row_without_a_sample_index_is_seeded_by_the_process_numbering(tiny_model_dir, tiny_processor, tiny_llm,
                                                                          monkeypatch):
    settings = settings_for(tiny_processor, grammar=False, response_length=8, max_turns=1)
    worker = local_worker(tiny_model_dir, tiny_llm, settings)
    worker.llm_client = SeedRecorder(worker.llm_client)
    monkeypatch.setattr(agent_loop, "trajectory_number", lambda: 987654321)
    rows = prompt_rows(sample_prompts(1, with_images=False), "tags")
    del rows.non_tensor_batch[SAMPLE_COLUMN]  # as verl's dataset hands rows
    asyncio.run(worker.generate_sequences(rows))
    assert worker.llm_client.seeds == [request_seed(settings["seed"], 0, 987654321, 0)]


# ---- prompt images in the shapes verl's dataset writes ----

def png_bytes(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def image_shapes(tmp_path) -> dict:
    """name -> (an entry of a row's image column as verl's dataset reads it, the RGB image it is)."""
    gray = Image.fromarray((np.arange(56 * 84).reshape(56, 84) % 251).astype(np.uint8), mode="L")
    rgba = Image.fromarray((np.arange(70 * 42 * 4).reshape(70, 42, 4) % 253).astype(np.uint8), mode="RGBA")
    path = tmp_path / "page.png"
    gray.save(path)
    data_url = "data:image/png;base64," + base64.b64encode(png_bytes(rgba)).decode()
    return {
        "pil": (rgba.copy(), rgba.convert("RGB")),
        "parquet_bytes_and_path": ({"bytes": png_bytes(gray), "path": None}, gray.convert("RGB")),
        "bytes": ({"bytes": png_bytes(rgba)}, rgba.convert("RGB")),
        "path_string": (str(path), gray.convert("RGB")),
        "path_like": (path, gray.convert("RGB")),
        "file_url": ({"image": f"file://{path}"}, gray.convert("RGB")),
        "data_url": ({"image": data_url}, rgba.convert("RGB")),
        "image_url": ({"image_url": str(path)}, gray.convert("RGB")),
    }


def verl_messages(images: list, text: str = "Which page shows it?") -> list:
    """The `raw_prompt` verl's `RLHFDataset` gives the loop for a row with this image column
    (its own `_build_messages`, on the attributes it reads)."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    dataset = SimpleNamespace(image_key="images", video_key="videos", audio_key="audios", processor=object())
    row = {"prompt": [{"role": "user", "content": "<image>" * len(images) + text}], "images": list(images)}
    return RLHFDataset._build_messages(dataset, row, "prompt")


def test_every_image_shape_of_verls_dataset_is_read_as_its_rgb_image(tmp_path):
    shapes = image_shapes(tmp_path)
    for name, (entry, expected) in shapes.items():
        (image,) = prompt_images(verl_messages([entry]))
        assert isinstance(image, Image.Image) and image.mode == "RGB", (name, type(image))
        assert image.size == expected.size and np.array_equal(np.asarray(image), np.asarray(expected)), name


def test_rows_with_prompt_images_of_verls_shapes_roll_out_and_check(tmp_path, tiny_model_dir, tiny_processor, tiny_llm):
    shapes = image_shapes(tmp_path)
    settings = settings_for(tiny_processor, grammar=False, response_length=8, max_turns=1, temperature=0.0)
    worker = local_worker(tiny_model_dir, tiny_llm, settings)
    rows = prompt_rows(sample_prompts(2, with_images=False), "tags")
    columns = [[shapes["path_string"][0], shapes["parquet_bytes_and_path"][0]], [shapes["data_url"][0]]]
    for row, images in enumerate(columns):
        text = rows.non_tensor_batch["raw_prompt"][row][0]["content"][0]["text"]
        rows.non_tensor_batch["raw_prompt"][row] = verl_messages(images, text)
    out = asyncio.run(worker.generate_sequences(rows))
    shown = [list(item["images"]) for item in out.non_tensor_batch["multi_modal_data"]]
    report = check_batch(from_dataproto(out, model_path=tiny_model_dir), tiny_model_dir)
    assert report.ok, report.human()
    assert [[image.size for image in images] for images in shown] == [[(84, 56), (84, 56)], [(42, 70)]]
