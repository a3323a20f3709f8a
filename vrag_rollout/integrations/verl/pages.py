"""Pages once in verl's agent-loop worker: the image processor runs once per distinct page.

verl computes each trajectory's `multi_modal_inputs` in the agent-loop worker
(`AgentLoopWorker._compute_multi_modal_inputs`: the processor on the trajectory's text and
images) and ships them to the trainer in the batch: as shipped, one `pixel_values` per trajectory
and one processor run per page reference. `PagedAgentLoopWorker` keeps verl's computation and
changes what it costs and holds:
- the processor's image processor becomes `image_inputs.OncePerImage`: a page object (the loop's
  pages are shared by every trajectory of the process that is shown them: `rollout/tools.py`'s
  page cache) is processed once, and the processor still gets exactly the stacked outputs it
  would have computed, so the text it expands and everything verl derives (positions,
  `images_seqlens`) are unchanged;
- the trajectory's inputs become `image_inputs.SharedImageInputs` over those per-page outputs
  (verl's pydantic output model copies them into a plain dict on construction; the worker puts
  the shared ones back right after), which verl's readers (`extract_multi_modal_inputs`, the position-id code, the trainer's
  `images_seqlens` loop) read as the dict they were: `pixel_values` is stacked when read, and the
  batch pickled to the trainer carries each distinct page's outputs once per pickle.

`GuardedAgentLoopWorker` (the class `GuardedAgentLoopManager` spawns) is one of these.
"""

from __future__ import annotations

from typing import Any, Optional

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from ..image_inputs import OncePerImage, SharedImageInputs


def once_per_image(processor: Any) -> Optional[OncePerImage]:
    """The processor's image processor, made `OncePerImage` (in place, once); None for a
    processor other than the Qwen VL families' (whose image processor works per image, the
    premise of stacking per-image outputs)."""
    image_processor = getattr(processor, "image_processor", None)
    per_image = isinstance(image_processor, OncePerImage) or any(
        cls.__name__.startswith("Qwen2VLImageProcessor") for cls in type(image_processor).__mro__)
    if not per_image:
        return None
    if not isinstance(image_processor, OncePerImage):
        image_processor = processor.image_processor = OncePerImage(image_processor)
    return image_processor


def shared_inputs(inputs: dict, parts: Optional[list]) -> Any:
    """verl's computed inputs with the per-image keys read from `parts` (the outputs of the
    processor call that made them); as they are when that call did not go per image."""
    if not parts or "pixel_values" not in inputs:
        return inputs
    rows = sum(int(part["pixel_values"].shape[0]) for part in parts)
    if int(inputs["pixel_values"].shape[0]) != rows:
        return inputs  # not the call these parts answered
    per_image = set(parts[0])
    return SharedImageInputs(parts, {name: value for name, value in inputs.items() if name not in per_image})


class PagedAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker whose trajectories share their pages' processor outputs."""

    def _shared_by_output(self) -> dict:
        """id(trajectory output) -> its shared inputs, from `_compute_multi_modal_inputs` until
        `_agent_loop_postprocess` puts them in the trajectory's internal output."""
        if "_shared_inputs" not in self.__dict__:
            self._shared_inputs: dict = {}
        return self._shared_inputs

    def _compute_multi_modal_inputs(self, output: Any, input_ids: Any) -> Any:
        once = once_per_image(self.processor) if self.processor is not None else None
        if once is None:
            return super()._compute_multi_modal_inputs(output, input_ids)
        once.forget_last()
        inputs = shared_inputs(super()._compute_multi_modal_inputs(output, input_ids), once.last_parts())
        if isinstance(inputs, SharedImageInputs):
            self._shared_by_output()[id(output)] = inputs
        return inputs

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> Any:
        try:
            internal = await super()._agent_loop_postprocess(output, validate, **kwargs)
        finally:  # never left behind for a later output that reuses this id
            shared = self._shared_by_output().pop(id(output), None)
        if shared is not None:
            # verl's output model validated the inputs into a plain dict of stacked tensors (one
            # copy per trajectory): put the shared ones back (no validation on assignment)
            internal.multi_modal_inputs = shared
        return internal
