"""`vrag-rollout check`: verify a saved rollout batch independently of the code that made it.

`run_check(path, model_dir, forward=False) -> Report` loads a saved batch (or a pickled trainer
DataProto, see saved_batch.py) and checks it against the model's own code in `model_dir`:
contract (shapes, masks, tokens), image tokens, observations, positions, GRPO groups and,
optionally, the rollout logprobs against a forward pass. Each module's docstring states its check.

Independence: this package imports nothing of the rollout's own token, position or vision code
(only `verify.saved_batch`, to read the file); its oracles are the model's processor and
transformers' `get_rope_index` and forward pass. Every failure names the check, the sample and
the position (in the full prompt+response row).

Modules:
- `report`: `Failure`, `Report` (human lines and the JSON line), `CheckInputError`.
- `oracle`: `ModelOracle`, the model's own config, processor, `get_rope_index` and weights.
- `rows`: `Row`, one sample's views of the batch tensors, for the per-sample checks.
- `contract`: tensor shapes, 0/1 masks, padding, mask nesting, EOS, finite rollout log-probs ("contract").
- `images`: vision blocks against the processor's expansion of the saved images ("image_tokens").
- `positions`: text and mrope positions against `get_rope_index` ("positions").
- `mrope_rule`: the still-image mrope rule, vectorised (the live guard's check of every sample;
  tested against `get_rope_index`).
- `observations`: masked blocks decode to tool results / tool turns ("observations").
- `groups`: each group is one prompt's samples, not all identical ("grpo").
- `segments`: a segmented batch's episodes: rows in order, contexts out of the loss and holding
  the earlier rows' sampled tokens verbatim ("segments").
- `turns`: each token's turn id against the loss mask's turn starts ("turns", when the batch has them).
- `forward`: rollout logprobs against a transformers forward pass ("forward", optional).
- `runner`: `check_batch`, `run_check` and the CLI body `main`.
"""

from .contract import EOS_REASONS, REQUIRED_TENSORS
from .forward import BANNED_BIAS
from .images import trainer_rescale
from .observations import RESULT_CLOSE, RESULT_OPEN, TOOL_CLOSE_TAGS
from .oracle import FAMILIES, ModelOracle, load_oracle
from .report import CheckInputError, Failure, Report
from .runner import check_batch, main, run_check

__all__ = [
    "BANNED_BIAS", "EOS_REASONS", "FAMILIES", "REQUIRED_TENSORS", "RESULT_CLOSE", "RESULT_OPEN", "TOOL_CLOSE_TAGS",
    "CheckInputError", "Failure", "ModelOracle", "Report",
    "check_batch", "load_oracle", "main", "run_check", "trainer_rescale",
]
