"""`vrag-rollout evaluate`: a checkpoint scored the way each benchmark's paper scores it.

Contract: `run_evaluation(out, data=, model= | family=, index= | retriever_url=, protocol=, ...)`
reads a converted benchmark file (`convert-dataset --from SET`, either layout; its `eval` column
names the set, the question's document, its answer format and the set's own categories) or a
file of your own questions (`convert-dataset` without `--from`, no `eval` column: the benchmark
`questions`, scored by the project's rules, `evaluation.scorers.questions`), rolls
the model out with the agent in batches of `batch_size` questions against the retriever
(`protocol.n` samples per question at `protocol.temperature`: by default one, greedily), and
appends one record per sample to `out/results.jsonl` (`evaluation.results`: the answer, how the
episode ended, its pages, each metric of the set's scorer, the retrieval metrics and, for
ViDoSeek with a judge, the judge's verdict). Each batch is saved (`out/episodes/batch-NNNN.pt`,
the saved-batch format) with its HTML view beside it. An interrupted run continues from
`results.jsonl`: questions with all their samples there are not rolled out again, and a file
written under another header is refused (`results_header`: every input that can change a score,
the index searched (`index_identity`) and the sets the file's questions belong to among them).
At the end it writes `report.json` and `report.md` (`evaluation.report`) and returns the report.
With `progress` it prints what it will do, what a resume found done, and a line per batch
(`evaluation.progress`).

The model: `model`, a local checkpoint of a supported family, or without it the tiny random
model of `family` (default qwen2-vl), built offline as `rollout` builds it. `grammar` (None: on
for the tiny model, off for a checkpoint, as in `rollout`) confines every turn to a well-formed
action; the tiny model without it almost never acts, and a warning says so. The header records
the model by its absolute path and its weights' fingerprint, and whether the grammar was on.

The protocol (`evaluation.protocol.Protocol`) is explicit: `scope` overrides the data's scope
(corpus: every question searches the whole index; document: its own document, the one the
conversion recorded) and the prompt's instructions with it, where they are a format's defaults.
The ViDoSeek judge (`judge`: a local checkpoint, served here by vLLM) reads the pinned prompt
of `evaluation.scorers.vidoseek` (VRAG-RL's); its verdict is recorded beside the rule-based score.
Where the protocol requires a search (`Protocol.requires_search`, VRAG-RL's rule), an answer
given without one scores 0 and the judge is not asked for it (`judge_plan`).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from .job_checks import JobInputError, RetrieverSource, check_retriever

EVAL_COLUMN = "eval"  # what `convert-dataset --from SET` records for scoring (dataset.py)
RESULTS, REPORT_JSON, REPORT_MD, EPISODES = "results.jsonl", "report.json", "report.md", "episodes"
JUDGED_SET = "vidoseek"  # the set VRAG-RL scores with a model judge


def read_benchmark(data: Path) -> tuple[list, list[dict], list[dict]]:
    """(prompt samples, ground truths, eval infos) of every row of a converted file. A row without
    an `eval` column (your own questions) is of the set `questions`, its document the row's own
    (none in corpus scope), and unanswerable where its reference answer says so ("Not answerable",
    `evaluation.scorers.questions.answerable`)."""
    import pyarrow.parquet as pq

    from ..data.dataset import DatasetError
    from ..data.questions import read_questions
    from ..evaluation.scorers import questions

    if not Path(data).is_file():
        raise JobInputError(f"--data {data}: no such file (convert your questions with `vrag-rollout "
                            f"convert-dataset`, a benchmark's with `--from SET`)")
    try:
        samples, truths = read_questions(Path(data))
    except DatasetError as error:
        raise JobInputError(f"--data {error}") from error
    table = pq.read_table(data)
    infos = []
    for row, sample in enumerate(samples):
        raw = table.column(EVAL_COLUMN)[row].as_py() if EVAL_COLUMN in table.column_names else None
        info = json.loads(raw) if raw else {}
        truth = truths[row]
        # no eval column (or a merged file's row of them): your own questions, answerable by the reference's word
        own = not info or info.get("set") == questions.NAME
        answerable = truth.get("answerable", questions.answerable(str(truth["answer"])) if own else True)
        infos.append({"set": info.get("set") or questions.NAME, "document": info.get("document") or sample.doc_id,
                      "answer_format": info.get("answer_format"), "categories": info.get("categories") or {},
                      "reference": info.get("reference"), "answerable": bool(answerable)})
    return samples, truths, infos


def in_scope(sample: Any, info: dict, scope: Optional[str], action_format: str, region: bool) -> Any:
    """The sample as the protocol's scope asks: its document named (document) or none (corpus),
    and the format's instructions for that scope where it carries a format's defaults."""
    from ..evaluation.scorers import questions
    from ..formats import format_named
    from ..formats.base import SCOPES

    if scope is None:
        return sample
    fmt = format_named(action_format)
    doc_id = info["document"] if scope == "document" else None
    if scope == "document" and doc_id is None:
        if info["set"] == questions.NAME:  # converted in corpus scope: the rows name no document
            raise JobInputError("--scope document: your own questions converted with --scope corpus name no "
                                "document (an open-domain one has none); evaluate them with --scope corpus, or "
                                "convert them again without --scope corpus")
        raise JobInputError("--scope document: the data does not record each question's document; convert it "
                            "again with `vrag-rollout convert-dataset --from SET`")
    defaults = {fmt.instructions_for(region, s) for s in SCOPES}
    instructions = fmt.instructions_for(region, scope) if sample.instructions in defaults else sample.instructions
    return replace(sample, doc_id=doc_id, instructions=instructions)


def question_record(question_id: str, info: dict, sample: Any, truth: dict, text: str, row: dict,
                    protocol: Any, judge: Optional[dict], draw: int = 0) -> dict:
    """One sample's line of `results.jsonl` (pure, given the decoded response and its columns);
    `draw` numbers the question's samples from 0."""
    from ..core.reward import last_answer
    from ..evaluation.coverage import coverage
    from ..evaluation.retrieval import retrieval_metrics
    from ..evaluation.scorers import scorer_for
    from ..evaluation.search_rule import searched, without_search

    answer = last_answer(text)
    scorer = scorer_for(info["set"])
    reference = info.get("reference") or str(truth["answer"])  # a list answer as the set's scoring reads it
    metrics = scorer.score(answer, reference, info["answer_format"], info["answerable"], question=sample.question)
    if judge is not None:  # the judge's verdict beside the rule-based scores (ViDoSeek)
        from ..evaluation.scorers.vidoseek import with_verdict

        metrics = with_verdict(metrics, judge["verdict"])
    did_search = searched(text, int(row.get("num_searches", 0)))
    if answer is not None and protocol.requires_search(info["set"]):  # VRAG-RL's rule
        metrics = {**metrics, "unsearched": 0.0} if did_search else without_search(metrics)
    turn_pages = [list(turn) for turn in row["turn_page_ids"]]
    retrieval = retrieval_metrics(turn_pages, truth)
    return {"question_id": question_id, "sample": draw, "set": info["set"], "question": sample.question,
            "document": info["document"], "scope": "corpus" if sample.doc_id is None else "document",
            "reference": truth["answer"], "answerable": info["answerable"], "answer_format": info["answer_format"],
            "categories": info["categories"], "answer": answer, "response": text,
            "termination": row["termination_reason"],
            "turns": len(turn_pages), "turn_page_ids": turn_pages, "searched": did_search, "metrics": metrics,
            "retrieval": retrieval, "coverage": coverage(retrieval), "efficiency": row.get("efficiency"),
            "judge": judge,
            "counted": protocol.counts(answered=answer is not None, answerable=info["answerable"]),
            "excluded": protocol.excluded_by(answered=answer is not None, answerable=info["answerable"]),
            "episode": dict(row["episode"])}


def judge_plan(infos: list[dict], texts: list[str], searches: list[int], protocol: Any) -> list[Optional[bool]]:
    """Per row: True to ask the judge, False for a judged set's row that is wrong without asking
    (no answer, or, under VRAG-RL's rule, no search: VRAG-RL scores it 0 unasked), None for a
    row of a set the judge does not score."""
    from ..core.reward import last_answer
    from ..evaluation.search_rule import searched

    plan: list[Optional[bool]] = []
    for info, text, count in zip(infos, texts, searches):
        if info["set"] != JUDGED_SET:
            plan.append(None)
        else:
            plan.append(last_answer(text) is not None
                        and (searched(text, count) or not protocol.requires_search(info["set"])))
    return plan


class Judge:
    """The ViDoSeek judge: a local checkpoint generating a verdict for the pinned prompt, greedily.

    Its engine starts on first use, after the policy's: on a GPU it takes `MEMORY_FRACTION` of the
    card beside the policy's `gpu_memory_utilization` (0.6 by default), and its context holds the
    prompt and the verdict only (`MAX_MODEL_LEN`)."""

    MAX_TOKENS = 256  # room for a few words before the <judge> block VRAG-RL's template asks for
    MEMORY_FRACTION = 0.25
    MAX_MODEL_LEN = 4096

    def __init__(self, model_dir: str, llm: Any = None):
        from transformers import AutoTokenizer

        if not (Path(model_dir) / "config.json").is_file():
            raise JobInputError(f"--judge {model_dir}: not a local model directory (no config.json)")
        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._llm = llm

    @property
    def llm(self) -> Any:
        if self._llm is None:
            from ..engine.llm import create_llm

            self._llm = create_llm(model=self.model_dir, dtype="auto", enforce_eager=True,
                                   gpu_memory_utilization=self.MEMORY_FRACTION, max_model_len=self.MAX_MODEL_LEN)
        return self._llm

    def batch_verdicts(self, plan: list, items: list[tuple[str, str, Optional[str]]]) -> list:
        """Per row of a batch (`plan`: `judge_plan`'s; `items`: (question, reference, answer)):
        the verdict for a row to ask, a wrong verdict unasked for a row that is wrong without
        asking, None for a row of a set the judge does not score."""
        asked = [i for i, ask in enumerate(plan) if ask]
        found = dict(zip(asked, self.verdicts([items[i] for i in asked])))
        return [found[i] if ask else ({"verdict": False, "text": None} if ask is False else None)
                for i, ask in enumerate(plan)]

    def verdicts(self, items: list[tuple[str, str, str]]) -> list[dict]:
        """(question, reference, answer) -> {"verdict": bool | None, "text": the judge's words}."""
        if not items:
            return []
        from ..engine.llm import greedy_texts
        from ..evaluation.scorers.vidoseek import judge_request, read_judge_verdict

        # no thinking: the <judge> block within MAX_TOKENS (templates without the switch ignore it)
        prompts = [self.tokenizer.apply_chat_template([{"role": "user", "content": judge_request(q, r, a)}],
                                                      add_generation_prompt=True, tokenize=False,
                                                      enable_thinking=False)
                   for q, r, a in items]
        return [{"verdict": read_judge_verdict(text), "text": text}
                for text in greedy_texts(self.llm, prompts, self.MAX_TOKENS)]


TINY_WITHOUT_GRAMMAR = ("the tiny random model will not act without --grammar: it almost never writes a "
                        "well-formed search, fetch or answer, so its scores say nothing")


def run_evaluation(out: Path, *, data: Path, protocol: Any, model: Optional[str] = None,
                   family: Optional[str] = None, index: Optional[Path] = None, retriever_url: Optional[str] = None,
                   batch_size: int = 8, limit: Optional[int] = None, grammar: Optional[bool] = None,
                   judge_model: Optional[str] = None, llm: Any = None, judge_llm: Any = None,
                   progress: bool = True) -> dict:
    """The job (module docstring); `llm`/`judge_llm`: running engines of the same models (tests)."""
    import sys

    from ..data.questions import written_for
    from ..evaluation.progress import resume_line
    from ..evaluation.results import ResultsBusy, ResultsFile, ResultsMismatch
    from .demo import demo_model
    from .rollout_job import page_counts_of

    if index is not None and retriever_url is not None:
        raise JobInputError("pass only one retriever: --index DIR (served for the run) or --retriever-url URL")
    if index is None and retriever_url is None:
        raise JobInputError("name the retriever: --index DIR (served for the run) or --retriever-url URL")
    samples, truths, infos = read_benchmark(Path(data))
    sets = sorted({info["set"] for info in infos})  # the whole file's: a --limit run resumes into the same file
    if limit is not None:
        samples, truths, infos = samples[:limit], truths[:limit], infos[:limit]
    written = written_for(samples)
    fmt, region = written if written is not None else ("tags", False)
    samples = [in_scope(s, i, protocol.scope, fmt, region) for s, i in zip(samples, infos)]
    # what can be wrong is found before any model loads: the retriever, the models, the results file
    check_retriever(RetrieverSource(index=index, url=retriever_url), [s.doc_id for s in samples],
                    page_counts_of(Path(data), len(samples)) if protocol.scope != "corpus" else None, "fail")
    try:
        model_dir, _family = demo_model(family, model)
    except (FileNotFoundError, ValueError) as error:
        raise JobInputError(str(error)) from error
    model_dir = Path(model_dir).resolve()  # the header names the weights wherever the run started
    grammar = model is None if grammar is None else bool(grammar)
    if model is None and not grammar:
        print(f"warning: {TINY_WITHOUT_GRAMMAR}", file=sys.stderr)
    judge = Judge(judge_model, judge_llm) if judge_model else None
    if judge is not None:  # the report records the judge, its weights and its pinned prompt
        from ..evaluation.scorers.vidoseek import JUDGE_PROMPT, JUDGE_PROMPT_VERSION

        protocol = replace(protocol, judge={"model": str(Path(judge_model).resolve()),
                                            "fingerprint": _fingerprint(judge_model),
                                            "prompt_version": JUDGE_PROMPT_VERSION, "prompt": JUDGE_PROMPT})
    header = results_header(protocol, data=str(Path(data).resolve()), data_sha256=_digest(Path(data)),
                            model=str(model_dir), model_fingerprint=_fingerprint(model_dir),
                            scopes=sorted({"corpus" if s.doc_id is None else "document" for s in samples}),
                            grammar=grammar, index=index_identity(index, retriever_url), sets=sets)
    out = Path(out)
    try:
        results = ResultsFile.open(out / RESULTS, header)
    except (ResultsMismatch, ResultsBusy) as error:
        raise JobInputError(f"--out {out}: {error}") from error
    question_ids = _question_ids(Path(data), len(samples))
    run = _Run(out, model_dir, protocol, samples, truths, infos, question_ids, fmt, region, judge)
    with results:
        complete = results.complete(protocol.n)
        todo = [k for k, qid in enumerate(question_ids) if qid not in complete]
        if progress and len(todo) < len(question_ids):  # a resume: say what it found
            print(resume_line(len(question_ids) - len(todo), len(question_ids)), flush=True)
        if todo:
            run.roll_out(todo, results, index=index, retriever_url=retriever_url, batch_size=batch_size,
                         grammar=grammar, llm=llm, progress=progress)
        return run.write_report(results.records, header)


def results_header(protocol: Any, *, data: str, data_sha256: str, model: str, model_fingerprint: str,
                   scopes: list[str], grammar: bool, index: dict, sets: list[str]) -> dict:
    """`results.jsonl`'s header: everything a resumed run must share with the first because it can
    change a score: the protocol, the data (its bytes, not only its path), the model (its weights,
    not only its path), the scopes the rows were searched in, whether a grammar shaped the
    actions, the index searched (`index_identity`), and the sets the data's questions belong to,
    whose rules score them (`questions`: your own questions, the project's rules)."""
    return {"protocol": protocol.to_dict(), "data": data, "data_sha256": data_sha256, "sets": sets, "model": model,
            "model_fingerprint": model_fingerprint, "scopes": scopes, "grammar": grammar, "index": index}


def index_identity(index: Optional[Path], retriever_url: Optional[str]) -> dict:
    """The identity of the index the run searches (`evaluation.index_identity`): from the
    manifest of `--index`, or from what each `--retriever-url` replica reports (replicas that
    report different indexes are refused)."""
    from ..evaluation.index_identity import from_manifest

    if index is not None:
        from ..data.dataset import IndexDirError, index_manifest

        try:
            manifest = index_manifest(Path(index))
        except IndexDirError as error:
            raise JobInputError(f"--index {error}") from error
        return from_manifest(manifest.to_json(), {doc.doc_id: doc.num_pages for doc in manifest.docs})
    from ..retrieval.congestion import parse_urls

    found = [_served_identity(url) for url in parse_urls(retriever_url)]
    if len({json.dumps(one, sort_keys=True) for one in found}) > 1:
        raise JobInputError(f"--retriever-url {retriever_url}: the replicas serve different indexes ({found}); "
                            "name replicas of one index")
    return found[0]


def _served_identity(url: str) -> dict:
    from ..evaluation.index_identity import from_server
    from ..retrieval.blocking import HttpTransport
    from ..retrieval.transport import TransportError

    transport = HttpTransport(url, retries=1, binary=False)

    def get(path: str) -> Any:
        try:
            return transport.get(path, 5.0)
        except TransportError:
            return None  # a route this server does not have, or no answer: it reports less

    try:
        return from_server(get("/ready"), get("/health"), get("/documents"), url)
    finally:
        transport.close()


@dataclass
class _Run:
    """One evaluation's questions, as the protocol asks them, and where its files go."""

    out: Path
    model_dir: Path
    protocol: Any
    samples: list
    truths: list
    infos: list
    question_ids: list
    action_format: str
    region: bool
    judge: Optional[Judge]

    def config_overrides(self, processor: Any, grammar: bool, index: Optional[Path]) -> dict:
        from .demo import FREE_QUERY, acting_grammar, demo_page_band
        from .rollout_job import default_prompt_length, grammar_max_page

        p = self.protocol
        overrides = dict(n=p.n, temperature=p.temperature, seed=p.seed, max_turns=p.max_turns,
                         response_length=p.response_length, top_n=p.top_n, action_format=self.action_format,
                         region_action=self.region, prompt_length=default_prompt_length(self.action_format),
                         action_regex=None, first_turn_action_regex=None, calculate_log_probs=False,
                         **p.budget())  # the visual budget and context edits the protocol records
        if grammar:  # a tiny random model: well-formed actions, and small pages for a fast CPU run
            overrides.update(acting_grammar(self.action_format, FREE_QUERY, grammar_max_page(None, index)),
                             **demo_page_band(processor))
        return overrides

    def roll_out(self, todo: list[int], results: Any, *, index: Optional[Path], retriever_url: Optional[str],
                 batch_size: int, grammar: bool, llm: Any, progress: bool) -> None:
        """Roll `todo` (row numbers) out in batches, appending each batch's records to `results`."""
        import time

        from transformers import AutoProcessor

        from ..data.prompts import build_prompts
        from ..engine.llm import configure_cpu_defaults
        from ..evaluation.progress import batch_line, plan_line
        from ..rollout.agent import vLLMRolloutAgent
        from .demo import demo_config

        say = (lambda line: print(line, flush=True)) if progress else (lambda line: None)
        configure_cpu_defaults()
        processor = AutoProcessor.from_pretrained(self.model_dir)
        (self.out / EPISODES).mkdir(parents=True, exist_ok=True)
        total, done_before = len(self.samples), len(self.samples) - len(todo)
        batches = -(-len(todo) // batch_size)
        say(plan_line(len(todo), self.protocol.n, batch_size))
        with ExitStack() as stack:
            if index is not None:
                from retriever_server.api.testing import serve_in_thread

                retriever_url = stack.enter_context(serve_in_thread(Path(index)))
            config = demo_config(retriever_url=retriever_url, **self.config_overrides(processor, grammar, index))
            if llm is None:
                say(f"starting vLLM with {self.model_dir} (the first batch waits for it)")
            agent = vLLMRolloutAgent(str(self.model_dir), config, processor.tokenizer, processor, inference_engine=llm)
            started = time.monotonic()
            for number, start in enumerate(range(0, len(todo), batch_size), 1):
                chosen = todo[start:start + batch_size]
                prompts = build_prompts([self.samples[k] for k in chosen], tokenizer=processor.tokenizer,
                                        processor=processor, config=config)
                results.append(self.records(chosen, agent.generate_sequences(prompts), processor, config))
                say(batch_line(number, batches, done=done_before + start + len(chosen), total=total,
                               done_before=done_before, elapsed=time.monotonic() - started))

    def records(self, chosen: list[int], output: Any, processor: Any, config: Any) -> list[dict]:
        """A rolled-out batch saved with its view, and its questions' records: one per episode,
        read from its last row (under context edits an episode is several rows, each earlier one
        ended by an edit: `training.segments.last_rows`; its last holds every turn it sampled)."""
        from ..core.reward import last_answer
        from ..training.learn import episode_texts
        from ..training.segments import last_rows
        from ..verify.saved_batch import save_rollout
        from ..verify.view import write_html
        from .demo import add_truths_and_rewards

        episodes = self.out / EPISODES
        number = 1 + max((int(p.stem.removeprefix("batch-")) for p in episodes.glob("batch-[0-9]*.pt")), default=0)
        add_truths_and_rewards(output, processor.tokenizer, [self.truths[k] for k in chosen])
        saved = episodes / f"batch-{number:04d}.pt"
        save_rollout(output, saved, processor=processor, model_path=self.model_dir, config=config)
        view = write_html(saved, saved.with_suffix(".html"))
        finals = last_rows(output)  # each episode's last row (every row without context edits)
        every = episode_texts(output, processor.tokenizer)
        texts = [every[row] for row in finals]
        columns = output.non_tensor_batch
        searches = [int(columns["num_searches"][row]) for row in finals]
        n = len(finals) // len(chosen)
        rows = [chosen[i // n] for i in range(len(finals))]  # each question's n samples, in a run
        verdicts = [None] * len(rows)
        if self.judge is not None:
            plan = judge_plan([self.infos[k] for k in rows], texts, searches, self.protocol)
            items = [(self.samples[k].question, str(self.truths[k]["answer"]), last_answer(texts[i]))
                     for i, k in enumerate(rows)]
            verdicts = self.judge.batch_verdicts(plan, items)
        costs = episode_costs(output, processor)
        return [question_record(self.question_ids[k], self.infos[k], self.samples[k], self.truths[k], texts[i],
                                {"turn_page_ids": columns["turn_page_ids"][finals[i]],
                                 "termination_reason": columns["termination_reason"][finals[i]],
                                 "num_searches": searches[i], "efficiency": costs[i],
                                 "episode": {"batch": str(view.relative_to(self.out)), "row": finals[i]}},
                                self.protocol, verdicts[i], draw=i % n)
                for i, k in enumerate(rows)]

    def write_report(self, records: list[dict], header: dict) -> dict:
        """`report.json` and `report.md` over this run's questions (a --limit run: only its own)."""
        from ..evaluation.report import build_report, markdown

        chosen = set(self.question_ids)
        report = build_report([r for r in records if r["question_id"] in chosen], header)
        views = sorted(str(p.relative_to(self.out)) for p in (self.out / EPISODES).glob("batch-*.html"))
        (self.out / REPORT_JSON).write_text(json.dumps({**report, "views": views}, indent=1, ensure_ascii=False),
                                            encoding="utf-8")
        (self.out / REPORT_MD).write_text(markdown(report, views), encoding="utf-8")
        return report


def episode_costs(output: Any, processor: Any) -> list[dict]:
    """Each episode's cost (`evaluation.efficiency.episode_cost`) from the rolled-out batch, in
    episode order: its loss mask, its response's image tokens, its call counters (its last row's),
    and its share of the batch's wall time. An episode cut into rows by context edits counts each
    row's own part once (the tokens after its `context_length`: its context repeats earlier rows),
    so its sampled tokens are all it sampled and its visual tokens all it was shown."""
    from ..evaluation.efficiency import episode_cost
    from ..training.segments import last_rows

    tokens, columns = output.batch, output.non_tensor_batch
    width = tokens["responses"].shape[1]
    attention = tokens["attention_mask"][:, -width:].tolist()
    seconds = (output.meta_info.get("metrics") or {}).get("rollout/seconds")
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    finals = last_rows(output)
    ids = columns["episode_id"] if "episode_id" in columns else range(len(attention))
    context = columns["context_length"] if "context_length" in columns else [0] * len(attention)
    parts: dict[int, list[int]] = {}  # episode -> its rows
    for row, episode in enumerate(ids):
        parts.setdefault(int(episode), []).append(row)
    zeros = [0] * len(attention)
    turns = columns["num_turns"] if "num_turns" in columns else [len(pages) for pages in columns["turn_page_ids"]]

    def own(values: list, row: int) -> list:  # the row's own part: after its context
        return values[int(context[row]):]

    own_seconds = columns.get("episode_seconds")  # each episode's own latency, where the rollout timed it
    costs = []
    for last in finals:
        rows = parts[int(ids[last])]
        costs.append(episode_cost(
            turns=turns[last], loss_mask=[m for r in rows for m in own(tokens["loss_mask"][r].tolist(), r)],
            response_ids=[t for r in rows for t in own(tokens["responses"][r].tolist(), r)],
            attention=[a for r in rows for a in own(attention[r], r)], image_pad_id=pad,
            searches=columns.get("num_searches", zeros)[last], fetches=columns.get("num_fetches", zeros)[last],
            crops=columns.get("num_crops", zeros)[last],
            seconds=float(own_seconds[last]) if own_seconds is not None else
            None if seconds is None else seconds / len(finals)))
    return costs


def _fingerprint(model_dir: Any) -> str:
    """A checkpoint's identity from its files (config.json, each weight file's size and ends), as
    the retriever identifies its encoder checkpoints."""
    from retriever_server.encoders.base import checkpoint_fingerprint

    return checkpoint_fingerprint(Path(model_dir))


def _digest(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _question_ids(data: Path, count: int) -> list[str]:
    """Each row's question id (the converted file's `question_id` column; verl rows keep it in
    `extra_info`), the key `results.jsonl` resumes by."""
    import pyarrow.parquet as pq

    table = pq.read_table(data)
    if "question_id" in table.column_names:
        ids = table.column("question_id").to_pylist()
    else:
        ids = [(info or {}).get("question_id") for info in table.column("extra_info").to_pylist()]
    ids = [str(qid) if qid is not None else f"row-{k + 1}" for k, qid in enumerate(ids)][:count]
    if len(set(ids)) != len(ids):
        raise JobInputError(f"--data {data}: question ids repeat; results could not be resumed by them")
    return ids


def compare_runs(run_a: Path, run_b: Path) -> str:
    """`evaluate --compare A B`: the two runs' reports side by side (`evaluation.compare`), as
    Markdown; a run that is no evaluation, or whose report and results were written under two
    headers (two protocols in one column), is refused."""
    from ..evaluation.compare import compare, markdown, mixed

    reports = []
    for run in (Path(run_a), Path(run_b)):
        try:
            report = json.loads((run / REPORT_JSON).read_text(encoding="utf-8"))
            first = (run / RESULTS).read_text(encoding="utf-8").split("\n", 1)[0]
            written = json.loads(first)["header"]
        except (OSError, ValueError, KeyError) as error:
            raise JobInputError(f"--compare {run}: not an evaluation's directory (report.json and results.jsonl): "
                                f"{error}") from None
        differ = mixed(report["header"], json.loads(json.dumps(written)))
        if differ:
            raise JobInputError(f"--compare {run}: its report.json and results.jsonl were written under different "
                                f"settings ({', '.join(differ)}): one column would hold two protocols; run "
                                "`vrag-rollout evaluate` on it again to rewrite the report")
        reports.append(report)
    return markdown(compare(*reports), (Path(run_a).name or str(run_a), Path(run_b).name or str(run_b)))


__all__ = ["run_evaluation", "compare_runs"]
