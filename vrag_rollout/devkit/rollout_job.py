"""`vrag-rollout rollout`: the agent on a user's own questions and documents.

Contract: `run_rollout(out, data=, index= | retriever_url= | fixtures=, model= | family=, ...)`
reads the first `batch_size` questions of a parquet `convert-dataset` wrote (either layout), checks
the retriever and the questions' documents before any engine starts (`job_checks`: an index passed
with `index` is served on loopback for the run), rolls the agent out over them on vLLM with the
model named (a local checkpoint, or a family's tiny model), scores each episode with the
project's reward against the questions' own ground truths, and saves the batch where `check`
and `view` read it (`out`; the check's verdict is printed and the HTML view written beside it,
as the demo does).

The action format and region action default to the ones the questions' instructions were written
for (`convert-dataset --action-format`); naming another is refused, since the model would be told
one grammar and parsed with another. `grammar=True` (the default for a tiny model, which is
random and would otherwise end its first turn without an action) confines every turn to a
well-formed action: the first turn searches (any short lowercase query) or fetches, later turns
search, fetch or answer. A trained checkpoint writes its own actions (`grammar=False`, its
default), as in a trainer.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

from .job_checks import JobInputError, RetrieverSource, check_retriever

GRAMMAR_MAX_PAGE = 9  # pages the grammar may fetch when neither the data nor the index counts them
# room for the instructions, and for the tool schemas where the format's prompts show them
PROMPT_LENGTH, PROMPT_LENGTH_WITH_TOOLS = 1024, 1536


def default_prompt_length(action_format: str) -> int:
    from ..formats import format_named

    return PROMPT_LENGTH_WITH_TOOLS if format_named(action_format).renders_tools else PROMPT_LENGTH


def read_job_questions(data: Path, batch_size: int, offset: int = 0) -> tuple[list, list]:
    """The questions and truths (`batch_size` rows from row `offset`), or `JobInputError` for a
    file that is not a converted dataset."""
    from ..data.dataset import DatasetError
    from ..data.questions import read_questions

    if not Path(data).is_file():
        raise JobInputError(f"--data {data}: no such file (write one with `vrag-rollout convert-dataset`)")
    try:
        return read_questions(Path(data), batch_size, offset)
    except DatasetError as error:
        data = Path(data)
        converted = data.with_suffix(".parquet") if data.suffix != ".parquet" else data
        source = data if converted != data else "QUESTIONS"
        raise JobInputError(f"--data {error}; --data takes a converted dataset: convert a questions file first, "
                            f"`vrag-rollout convert-dataset {source} --out {converted}`, then pass --data "
                            f"{converted}") from error


def job_format(samples: list, action_format: Optional[str], region_action: Optional[bool]) -> tuple[str, bool]:
    """(action format, region action): the ones the questions were written for, unless named."""
    from ..data.questions import written_for

    written = written_for(samples)
    if written is None:  # the user's own instructions: any format they name
        return action_format or "tags", bool(region_action)
    fmt, region = written
    if action_format not in (None, fmt) or region_action not in (None, region):
        raise JobInputError(
            f"--action-format {action_format or fmt}{' --region-action' if region_action else ''}: the questions' "
            f"instructions are written for {fmt}{' with the region action' if region else ''}; run with those, or "
            f"convert the questions again with `convert-dataset --action-format {action_format or fmt}`")
    return fmt, region


def page_counts_of(data: Path, limit: int, offset: int = 0) -> Optional[list]:
    """The page counts the data recorded per row (convert-dataset --index), or None."""
    import pyarrow.parquet as pq

    from ..data.dataset import PAGE_COUNT
    from ..retrieval.preflight import page_count_value

    table = pq.read_table(data)
    if PAGE_COUNT not in table.column_names:
        return None
    return [page_count_value(value) for value in table.column(PAGE_COUNT).slice(offset, limit).to_pylist()]


def grammar_max_page(page_counts: Optional[list], index: Optional[Path]) -> int:
    """The last page the acting grammar may fetch: the longest document's, where known."""
    counts = [count for count in page_counts or () if count]
    if not counts and index is not None:
        from ..data.dataset import index_documents

        counts = list(index_documents(index).values())
    return max(counts) if counts else GRAMMAR_MAX_PAGE


def run_rollout(out: Path, *, data: Path, index: Optional[Path] = None, retriever_url: Optional[str] = None,
                fixtures: Optional[Path] = None, model: Optional[str] = None, family: Optional[str] = None,
                batch_size: int = 8, n: int = 1, max_turns: int = 4, response_length: int = 1024,
                temperature: float = 1.0, seed: int = 0, action_format: Optional[str] = None,
                region_action: Optional[bool] = None, grammar: Optional[bool] = None,
                prompt_length: Optional[int] = None, retriever_preflight: str = "fail", llm: Any = None,
                offset: int = 0, context: Optional[dict] = None) -> dict:
    """The job (module docstring); `llm` is an already running engine of the same model (tests
    share one); `context`: the visual budgets and context policy (rollout config fields). Returns
    `finish_demo`'s dict."""
    from ..data.prompts import build_prompts
    from .demo import FREE_QUERY, acting_grammar, add_truths_and_rewards, demo_config, demo_model, demo_page_band, \
        finish_demo, in_corpus_scope

    from ..data.output_path import output_problem

    if (problem := output_problem(Path(out), "--out")) is not None:
        raise JobInputError(problem)
    if index is not None and retriever_url is not None:
        raise JobInputError("pass only one of --index DIR (served for the run) and --retriever-url URL")
    if index is None and retriever_url is None and fixtures is None:
        raise JobInputError("name the retriever: --index DIR (served for the run) or --retriever-url URL "
                            "(or --fixtures FILE to replay recorded traffic)")
    samples, truths = read_job_questions(Path(data), batch_size, offset)
    fmt, region = job_format(samples, action_format, region_action)
    page_counts = page_counts_of(Path(data), batch_size, offset)
    source = RetrieverSource(index=index, url=retriever_url, fixtures=fixtures)
    check_retriever(source, [sample.doc_id for sample in samples], page_counts, retriever_preflight)
    model_dir, _family = demo_model(family, model)
    acts = model is None if grammar is None else grammar

    from transformers import AutoProcessor

    from ..engine.llm import configure_cpu_defaults
    from ..rollout.agent import vLLMRolloutAgent

    configure_cpu_defaults()
    processor = AutoProcessor.from_pretrained(model_dir)
    overrides = dict(
        n=n, max_turns=max_turns, response_length=response_length, temperature=temperature, seed=seed,
        action_format=fmt, region_action=region, retriever_preflight=retriever_preflight,
        prompt_length=prompt_length or default_prompt_length(fmt), action_regex=None, first_turn_action_regex=None,
        retriever_fixtures=str(fixtures) if fixtures is not None else None,
    )
    if acts:
        overrides.update(acting_grammar(fmt, FREE_QUERY, grammar_max_page(page_counts, index), in_corpus_scope(samples)))
    if model is None:  # small pages keep a tiny model's CPU run fast; a checkpoint gets the defaults
        overrides.update(demo_page_band(processor))
    overrides.update(context or {})
    with ExitStack() as stack:
        if index is not None and fixtures is None:
            from retriever_server.api.testing import serve_in_thread

            retriever_url = stack.enter_context(serve_in_thread(Path(index)))
        config = demo_config(retriever_url=retriever_url or "http://127.0.0.1:8002", **overrides)
        try:
            prompts = build_prompts(samples, tokenizer=processor.tokenizer, processor=processor, config=config)
        except ValueError as error:  # a prompt longer than prompt_length
            raise JobInputError(f"--prompt-length {config.prompt_length}: {error}") from error
        agent = vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor, inference_engine=llm)
        output = agent.generate_sequences(prompts)
    add_truths_and_rewards(output, processor.tokenizer, truths)
    return finish_demo(output, Path(out), processor=processor, model_dir=Path(model_dir), config=config)


__all__ = ["run_rollout"]
