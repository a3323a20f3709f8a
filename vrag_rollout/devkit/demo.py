"""The main job: a real agent rollout on vLLM against the embedded retriever.

Builds (once, cached) the tiny model of the chosen family (Qwen2-VL by default; or takes a local
checkpoint of a supported family) and the sample corpus index, serves the index on loopback, runs
a batch of episodes, saves the output batch in the saved-batch format (`saved_batch.py`,
docs/saved-batch.md: tensors, page and prompt images as encoded bytes, columns, metrics, config,
model family, pixel band), then verifies the file with the independent checker (`verify/check`) and
writes its HTML view (`view.py`) beside it.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

from ..config import AgentRolloutConfig
from ..data.prompts import PromptSample, build_prompts
from ..formats import format_named

# The tiny model is random: a grammar makes vLLM's own sampling write well-formed actions.
# The demo's queries come from a closed list so recorded retriever fixtures cover every call;
# `rollout` on a user's own documents lets the model search any short query (`FREE_QUERY`).
_ANSWER = r"<answer>[a-z0-9 ]{1,12}</answer>"
FREE_QUERY = "[a-z ]{3,24}"


DEMO_TOP_N = 2
DEMO_MAX_PAGE = 6  # past the shortest document's end, so out-of-range fetches occur too
# Region boxes of the demo grammar (`region_action=True`): valid in both grounding frames (0..1000,
# and pixels of the demo's small pages), so each family's crops come back as images.
DEMO_BOXES = ((0, 0, 80, 80), (40, 60, 160, 180))


def _regex_literal(text: str) -> str:
    # re.escape also escapes spaces and hyphens, which xgrammar's regex dialect warns about.
    return "".join("\\" + c if c in "\\.^$*+?{}[]|()" else c for c in text)


def one_of(texts: list[str]) -> str:
    """A pattern matching exactly one of `texts`."""
    return "|".join(_regex_literal(text) for text in texts)


def page_numbers(max_page: int) -> str:
    """A pattern matching the page numbers 1..max_page."""
    if max_page < 1:
        raise ValueError(f"max_page must be >= 1, got {max_page}")
    return f"[1-{max_page}]" if max_page <= 9 else "(" + "|".join(str(n) for n in range(1, max_page + 1)) + ")"


def _boxes() -> str:
    return one_of([str(list(box)) for box in DEMO_BOXES])


_THOUGHT = r"<think>[a-z ]{3,16}</think>"


def turn_regex(action_format: str, query: str, max_page: int, answer: bool = True, fetch: bool = True) -> str:
    """A turn of the format's grammar: a thought, then a search (its query matching the pattern
    `query`), (with `fetch`) a fetch of a page up to `max_page`, or (with `answer`) an answer; in
    the native format one or two calls as the chat template writes them."""
    fmt = format_named(action_format)
    calls = [fmt.regex_search(query)] + ([fmt.regex_fetch(page_numbers(max_page))] if fetch else [])
    return fmt.regex_turn(_THOUGHT, calls, _ANSWER if answer else None)


def acting_grammar(action_format: str, query: str, max_page: int, corpus: bool = False) -> dict:
    """The config fields that make a random model act: a first turn that must search or fetch
    (so every episode retrieves; in corpus scope it must search, since a fetch reads the
    document of the last page shown and none has been), and later turns that search, fetch or
    answer."""
    return {"first_turn_action_regex": turn_regex(action_format, query, max_page, answer=False, fetch=not corpus),
            "action_regex": turn_regex(action_format, query, max_page)}


def in_corpus_scope(samples: Any) -> bool:
    """Whether any question searches the whole corpus (no document of its own)."""
    return any(getattr(sample, "doc_id", None) is None for sample in samples)


# A later turn of the region demo looks closer or answers, and the thought decides which: the
# tiny model is random, so its thought is noise, and the grammar makes the thought's first letter
# the choice. A thought starting with a..s crops the last page shown (about four in five of the
# tiny model's thoughts), one starting with t..z answers; so nearly every batch crops, most
# episodes crop before they answer, and a later turn may crop again. (Two grammars, the first
# turn's and the rest's, cannot say "crop once, then answer": that needs the turn number.)
_CROP_THOUGHT = r"<think>[a-s][a-z ]{2,15}</think>"
_ANSWER_THOUGHT = r"<think>[t-z][a-z ]{2,15}</think>"


def region_turn_regex(action_format: str = "tags") -> str:
    """A later turn with the region action: a look closer at the last page shown (`<bbox>`, or
    the `crop` tool without a page), or an answer."""
    fmt = format_named(action_format)
    return f"({_CROP_THOUGHT}{fmt.call_prefix}{fmt.regex_crop(_boxes())}|{_ANSWER_THOUGHT}{_ANSWER})"


def cache_dir() -> Path:
    from .tiny_model import default_model_dir

    return default_model_dir().parent


def prepare_index(work_dir: Path) -> Path:
    """The sample corpus and its index, built once under `work_dir`."""
    from retriever_server.indexing.indexer import build_index
    from retriever_server.sample_corpus import write_sample_corpus

    index_dir = work_dir / "sample-index"
    if not (index_dir / "manifest.json").exists():
        pdfs = write_sample_corpus(work_dir / "sample-corpus")
        build_index(pdfs, index_dir, min_pixels=32 * 28 * 28, max_pixels=128 * 28 * 28)
    return index_dir


def demo_prompts(tokenizer: Any, processor: Any, samples: list[PromptSample], config: AgentRolloutConfig) -> Any:
    """The prompt batch for `config`'s action format (`data.prompts.build_prompts`)."""
    return build_prompts(samples, tokenizer=tokenizer, processor=processor, config=config)


def demo_questions() -> list[PromptSample]:
    """One question per known fact, documents taken in turn so a small batch spans them all."""
    from retriever_server.sample_corpus import SAMPLE_FACTS

    by_doc: dict[str, list[str]] = {}
    for query, (doc, _page) in SAMPLE_FACTS.items():
        by_doc.setdefault(doc, []).append(query)
    rounds = zip(*[[(doc, q) for q in queries] for doc, queries in sorted(by_doc.items())])
    return [PromptSample(question=f"Which page covers {q}?", doc_id=doc) for turn in rounds for doc, q in turn]


def demo_retrieval_calls() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Every retriever call the demo grammar can make: (doc, query) and (doc, fetch spec)."""
    from retriever_server.sample_corpus import SAMPLE_FACTS

    docs = sorted({doc for doc, _ in SAMPLE_FACTS.values()})
    searches = [(doc, query) for doc in docs for query in sorted(SAMPLE_FACTS)]
    fetches = [(doc, f"{mode}, {page}") for doc in docs for mode in ("image", "text") for page in range(1, DEMO_MAX_PAGE + 1)]
    return searches, fetches


def record_demo_fixtures(out_path: Path, retriever_url: Optional[str] = None) -> dict:
    """Record every demo retriever call from a live server (the embedded one by default)."""
    from ..retrieval.fixtures import record_fixtures

    searches, fetches = demo_retrieval_calls()
    with ExitStack() as stack:
        if retriever_url is None:
            from retriever_server.api.testing import serve_in_thread

            retriever_url = stack.enter_context(serve_in_thread(prepare_index(cache_dir())))
        return record_fixtures(retriever_url, out_path, searches=searches, fetches=fetches, top_n=DEMO_TOP_N)


def demo_page_band(processor: Any) -> dict:
    """Small result pages (16 to 64 visual tokens of this model) keep the CPU demo fast; never
    below the processor's own minimum (Qwen3-VL's released processor takes at least 64 tokens)."""
    from ..core.vision import PixelBand

    image_processor = getattr(processor, "image_processor", processor)
    factor = int(image_processor.patch_size) * int(image_processor.merge_size)
    low = max(16 * factor**2, PixelBand.from_processor(processor).min_pixels)
    return {"page_min_pixels": low, "page_max_pixels": max(64 * factor**2, low)}


def demo_config(**overrides: Any) -> AgentRolloutConfig:
    from retriever_server.sample_corpus import SAMPLE_FACTS

    base = dict(
        n=2,
        temperature=1.0,
        seed=0,
        dtype="fp32",  # far faster than bf16 on CPUs without bf16 matrix units
        load_format="auto",
        enforce_eager=True,
        prompt_length=384,
        response_length=768,
        max_turns=4,
        top_n=DEMO_TOP_N,
        max_num_batched_tokens=4096,
        calculate_log_probs=True,  # the saved batch carries rollout_log_probs: `check --forward` reads them
    )
    # With the region action the first turn searches (its pages are what a later turn crops) and
    # later turns look closer at the last page shown or answer (`region_turn_regex`).
    regions = bool(overrides.get("region_action"))
    action_format = overrides.get("action_format", "tags")
    queries = one_of(sorted(SAMPLE_FACTS))
    # every episode retrieves before it may answer: the demo shows pages in tool turns
    base["action_regex"] = (region_turn_regex(action_format) if regions
                            else turn_regex(action_format, queries, DEMO_MAX_PAGE))
    base["first_turn_action_regex"] = turn_regex(action_format, queries, DEMO_MAX_PAGE, answer=False,
                                                 fetch=not regions)
    if format_named(action_format).renders_tools:
        base["prompt_length"] = 1280 if regions else 1024  # the tool schemas in the system turn
    if "action_regex" in overrides:  # the caller's grammar governs every turn unless it says otherwise
        base["first_turn_action_regex"] = None
    base.update(overrides)
    return AgentRolloutConfig(**base)


def demo_model(family: Optional[str] = None, model: Optional[str] = None, shape: str = "compact") -> tuple[Path, str]:
    """(model dir, family name): a local checkpoint of a supported family, or the family's tiny
    model of `shape` (built once, cached; docs/tiny-models.md). A family named beside a checkpoint
    must be the checkpoint's."""
    from ..families import detect_family, family_by_name
    from .tiny_model import build_tiny_model, default_model_dir

    if model is None:
        name = family_by_name(family or "qwen2-vl").name
        return build_tiny_model(default_model_dir(name, shape), name, shape=shape), name
    model_dir = Path(model).expanduser()
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"--model {model}: not a local model directory (no config.json)")
    detected = detect_family(model_dir).name
    if family is not None and family_by_name(family).name != detected:
        raise ValueError(f"--family {family} but the model at {model} is {detected}")
    return model_dir, detected


def run_demo(out_path: Path, *, family: Optional[str] = None, model: Optional[str] = None, batch_size: int = 4,
             retriever_url: Optional[str] = None, fixtures: Optional[str] = None, llm: Any = None,
             **config_overrides: Any) -> dict:
    """The demo job; `llm` is an already running engine of the same model (tests share one)."""
    from transformers import AutoProcessor

    from ..engine.llm import configure_cpu_defaults
    from ..rollout.agent import vLLMRolloutAgent

    configure_cpu_defaults()
    model_dir, family = demo_model(family, model)
    processor = AutoProcessor.from_pretrained(model_dir)
    tokenizer = processor.tokenizer
    with ExitStack() as stack:
        if retriever_url is None and fixtures is None:
            from retriever_server.api.testing import serve_in_thread

            retriever_url = stack.enter_context(serve_in_thread(prepare_index(cache_dir())))
        config = demo_config(retriever_url=retriever_url or "http://127.0.0.1:8002", retriever_fixtures=fixtures,
                             **{**demo_page_band(processor), **config_overrides})
        agent = vLLMRolloutAgent(str(model_dir), config, tokenizer, processor, inference_engine=llm)
        samples = demo_questions()[:batch_size]
        prompts = demo_prompts(tokenizer, processor, samples, config)
        output = agent.generate_sequences(prompts)
    add_truths_and_rewards(output, tokenizer, [demo_truth(sample) for sample in samples])
    return finish_demo(output, Path(out_path), processor=processor, model_dir=model_dir, config=config)


def demo_truth(sample: PromptSample) -> dict:
    """The ground truth of a demo question: the page of the sample corpus that covers its fact."""
    from retriever_server.sample_corpus import SAMPLE_FACTS

    fact = sample.question.removeprefix("Which page covers ").removesuffix("?")
    doc, page = SAMPLE_FACTS[fact]
    return {"answer": str(page), "doc_id": doc, "gold_pages": [page]}


def add_truths_and_rewards(output: Any, tokenizer: Any, truths: list) -> None:
    """Columns the viewer and readers of the saved batch use: each row's `ground_truth` (the
    JSON the reward reads, its prompt's), `reward` (`core.reward`'s overall and parts) and
    `answer` (the episode's last `<answer>`, None without one)."""
    import json

    from ..protocol import object_array
    from ..core.reward import last_answer
    from ..training.learn import episode_scores, episode_texts
    from ..training.segments import last_rows, prompt_rows

    # a segmented batch (context edits) has several rows an episode, each beside its prompt
    prompt_of = prompt_rows(output, len(last_rows(output)) // len(truths))
    output.non_tensor_batch["ground_truth"] = object_array([json.dumps(truths[k]) for k in prompt_of])
    output.non_tensor_batch["reward"] = object_array(episode_scores(output, tokenizer, truths))
    output.non_tensor_batch["answer"] = object_array([last_answer(text) for text in episode_texts(output, tokenizer)])


def finish_demo(output: Any, out_path: Path, *, processor: Any, model_dir: Path, config: AgentRolloutConfig) -> dict:
    """Save the batch, print one line per sample, check the saved file and write its view."""
    from ..verify.check import run_check
    from ..verify.saved_batch import save_rollout
    from ..verify.view import write_html
    from .episode_table import print_summary

    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_rollout(output, out_path, processor=processor, model_path=model_dir, config=config)
    print_summary(output, regions=config.region_action)
    samples = f"{len(output)} sample{'' if len(output) == 1 else 's'}"
    print(f"saved {samples} of {output.meta_info.get('model_family')} ({model_dir}) to {out_path}")
    report = run_check(out_path, model_dir)
    print(report.human())
    print(report.to_json())
    html = write_html(out_path, out_path.with_suffix(".html"))
    print(f"view: {html}")
    return {"output": output, "report": report, "html": html, "processor": processor}
