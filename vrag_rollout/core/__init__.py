"""The episode logic, pure: no vLLM, no network, no engine or retriever objects.

Rule (tests/test_layers.py): imports only `core/` and the package's leaf modules (`config`,
`protocol`, `families`); never `engine/`, `retrieval/`, vllm or an HTTP library.

- `actions`: the tag format's actions read from a turn's text, and every malformed one.
- `tool_turns`: the native tool-call format: the tools, reading calls, tool-turn tokens from the chat template.
- `readers`: pages, numbers and boxes read from the policy's text without ever raising (every parser uses them).
- `episode`: one sample's growing response and its invariants.
- `step`: one turn of one sample, shared by every schedule.
- `observation`: tool results as observation tokens (engine and trainer views).
- `serial_tokenizer`: a tokenizer any thread may call, one call at a time.
- `vision`: page decoding and resizing into the processor's pixel band.
- `pages`: page entries, one shared content-addressed copy per distinct page (and the decode cache).
- `regions`: a box in a family's grounding frame mapped to fractions of the page (the region action).
- `scope`: which document a call reads: the row's own, or in corpus scope the last page shown's.
- `positions`: mrope position ids of a sequence with images.
- `context_edit`: a context policy's edits between turns, and the segments (rows) they cut an episode into.
- `batch`: episodes (or their segments) assembled into the trainer's tensors and columns.
- `prompt_images`: the images of a prompt, in the input's spellings.
- `reward`: answer, format and retrieval scores of finished episodes.
- `turn_rewards`: each turn's reward (retrieval credited to the turn that showed the page, shaping parts).
"""
