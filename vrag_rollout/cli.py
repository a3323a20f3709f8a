"""`vrag-rollout`: the demo rollout, the closed GRPO loop (`learn`) and small utilities."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from .devkit.context_flags import CONTEXT_BUDGET, context_budget_flags, context_settings
from .devkit.learn_job import DEFAULTS as LEARN_DEFAULTS
from .devkit.tiny_model import SHAPES as TINY_SHAPES
from .families import FAMILY_NAMES


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none to show (None): the help says then
    what happens without the option."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if action.default is None else super()._get_help_string(action)


PREFLIGHT_HELP = ("before the engine starts, check that the retriever answers and holds the questions' documents: "
                  "fail stops with one line, warn prints it and goes on, off skips the check")


def _retriever_preflight(command: argparse.ArgumentParser) -> None:
    command.add_argument("--retriever-preflight", choices=("fail", "warn", "off"), default="fail", help=PREFLIGHT_HELP)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and option (parsing only: nothing heavy is imported here)."""
    parser = argparse.ArgumentParser(prog="vrag-rollout", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def subcommand(name: str, **kwargs: object) -> argparse.ArgumentParser:
        # every subcommand's --help shows each option's default
        return commands.add_parser(name, formatter_class=_DefaultsHelp, **kwargs)

    demo = subcommand("demo", help="run a real agent rollout on vLLM against the embedded retriever")
    demo.add_argument("--out", type=Path, default=Path("artifacts/demo_rollout.pt"), help="where to save the batch (docs/saved-batch.md); the HTML view goes beside it")
    demo.add_argument("--batch-size", type=int, default=4, help="number of questions (prompts)")
    demo.add_argument("--n", type=int, default=2, help="samples per question")
    demo.add_argument("--max-turns", type=int, default=4, help="generation turns per episode")
    demo.add_argument("--response-length", type=int, default=768,
                      help="token budget of an episode's response (sampled text and observations)")
    demo.add_argument("--seed", type=int, default=0, help="base of the per-sample sampling seeds")
    demo.add_argument("--rollout-mode", choices=["sync", "continuous"], default="continuous",
                      help="continuous: each sample advances on its own; sync: one generate call per turn")
    demo.add_argument("--retriever-url", default=None, help="use a running retriever instead of the embedded one")
    demo.add_argument("--fixtures", default=None, help="replay recorded retriever traffic from this file")
    demo.add_argument("--family", choices=FAMILY_NAMES, default=None,
                      help="model family of the tiny model to build and run (default qwen2-vl)")
    demo.add_argument("--action-format", choices=["tags", "tool_call"], default="tags",
                      help="tags: <search>/<fetch> in one turn; tool_call: the chat template's own tool calls")
    demo.add_argument("--model", default=None,
                      help="run on this local checkpoint of a supported family instead of a tiny model")
    demo.add_argument("--region-action", action="store_true",
                      help="let episodes look closer at a region of the last page shown (<bbox>, the crop tool)")
    _retriever_preflight(demo)
    context_budget_flags(demo)

    rollout = subcommand(
        "rollout", help="run the agent on your own questions (a convert-dataset parquet) against your index or "
                        "retriever, with the model you name; saves a batch that check and view read",
    )
    rollout.add_argument("--data", type=Path, required=True,
                         help="your questions: a parquet from convert-dataset (either --layout)")
    rollout.add_argument("--index", type=Path, default=None,
                         help="a retriever index of your documents (vrag-retriever index), served for the run")
    rollout.add_argument("--retriever-url", default=None, help="a running retriever instead (vrag-retriever serve)")
    rollout.add_argument("--fixtures", type=Path, default=None, help="replay recorded retriever traffic from this file")
    rollout.add_argument("--model", default=None, help="a local checkpoint of a supported family")
    rollout.add_argument("--family", choices=FAMILY_NAMES, default=None,
                         help="without --model: the family of the tiny random model to build and run "
                              "(default qwen2-vl)")
    rollout.add_argument("--out", type=Path, default=Path("artifacts/rollout.pt"),
                         help="where to save the batch (docs/saved-batch.md); the HTML view goes beside it")
    rollout.add_argument("--batch-size", type=int, default=8,
                         help="number of questions: the file's rows from --offset (its first rows by default)")
    rollout.add_argument("--offset", type=int, default=0, help="skip the file's first OFFSET rows")
    rollout.add_argument("--n", type=int, default=1, help="samples per question")
    rollout.add_argument("--max-turns", type=int, default=4, help="generation turns per episode")
    rollout.add_argument("--response-length", type=int, default=1024,
                         help="token budget of an episode's response (sampled text and observations)")
    rollout.add_argument("--prompt-length", type=int, default=None,
                         help="token budget of a prompt (default 1024; 1536 in the tool_call format)")
    rollout.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    rollout.add_argument("--seed", type=int, default=0, help="base of the per-sample sampling seeds")
    rollout.add_argument("--action-format", choices=["tags", "tool_call"], default=None,
                         help="default: the one the questions' instructions were written for (convert-dataset's "
                              "--action-format), else tags")
    rollout.add_argument("--region-action", action="store_true", default=None,
                         help="let episodes look closer at a region of a page (default: as the questions were written)")
    rollout.add_argument("--grammar", action=argparse.BooleanOptionalAction, default=None,
                         help="confine every turn to a well-formed action (the first searches or fetches); what "
                              "makes a tiny random model act (default: on without --model, off with it)")
    _retriever_preflight(rollout)
    context_budget_flags(rollout)

    evaluate = subcommand(
        "evaluate", help="score a checkpoint (or a tiny model) on a converted benchmark the way its paper does: "
                         "greedy rollouts (or --n samples for pass@k), the set's own scoring, retrieval recall and "
                         "NDCG; results.jsonl (resumable) and a report",
    )
    evaluate.add_argument("--compare", type=Path, nargs=2, default=None, metavar=("RUN_A", "RUN_B"),
                          help="instead of evaluating: print two evaluations' tables side by side, per set and "
                               "category, naming every protocol difference (no B - A column across two protocols)")
    evaluate.add_argument("--data", type=Path, default=None,
                          help="a benchmark converted with `convert-dataset --from SET`, or your own questions converted "
                               "without --from (scored as `questions` by the project's rules; either --layout)")
    evaluate.add_argument("--model", default=None,
                          help="the checkpoint to evaluate (a local directory of a supported family)")
    evaluate.add_argument("--family", choices=FAMILY_NAMES, default=None,
                          help="without --model: the family of the tiny random model to build and run "
                               "(default qwen2-vl)")
    evaluate.add_argument("--index", type=Path, default=None,
                          help="the benchmark's retriever index (vrag-retriever index), served for the run")
    evaluate.add_argument("--retriever-url", default=None, help="a running retriever instead (vrag-retriever serve)")
    evaluate.add_argument("--out", type=Path, default=None,
                          help="the evaluation's directory: results.jsonl, report.md, report.json, episodes/")
    evaluate.add_argument("--protocol", choices=["own", "vrag-rl", "document"], default="own",
                          help="a named protocol (docs/evaluation.md): vrag-rl (merged corpus, 4 turns, no answer "
                               "without a search, the judge's criteria), document (each question's own document), "
                               "own (the project's); each switch below overrides it, and the report records that")
    evaluate.add_argument("--scope", choices=["corpus", "document"], default=None,
                          help="search the whole index or each question's own document (default: the protocol's; "
                               "own: as converted)")
    evaluate.add_argument("--max-turns", type=int, default=None,
                          help="turns per question, the last must answer (default: the protocol's, 4)")
    evaluate.add_argument("--capped", choices=["wrong", "exclude"], default=None,
                          help="an episode that ended without an answer scores as wrong, or is left out (default: "
                               "wrong)")
    evaluate.add_argument("--unanswerable", choices=["score", "exclude"], default=None,
                          help="questions marked unanswerable (by the set, or a reference answer 'Not answerable') are "
                               "scored, or left out (default: score)")
    evaluate.add_argument("--response-length", type=int, default=None,
                          help="token budget of an episode's response, sampled text and observations (default: 1024)")
    evaluate.add_argument("--top-n", type=int, default=None, help="pages a search returns (default: 3)")
    evaluate.add_argument("--judge", default=None,
                          help="a local checkpoint that judges ViDoSeek answers by VRAG-RL's criteria and verdict "
                               "format (served by vLLM here); the rule-based scores are reported beside its verdicts")
    evaluate.add_argument("--search-required", choices=["set", "on", "off"], default=None,
                          help="VRAG-RL's rule that an answer given without any search scores 0: as each set is "
                               "published (on for ViDoSeek), on for every set, or off (default: the protocol's; "
                               "own: set, vrag-rl: on, document: off)")
    context_budget_flags(evaluate)  # the protocol's budget: recorded in its header (default: off)
    evaluate.add_argument("--batch-size", type=int, default=8, help="questions rolled out together")
    evaluate.add_argument("--limit", type=int, default=None, help="only the file's first LIMIT questions")
    evaluate.add_argument("--n", type=int, default=None,
                          help="samples per question (default: 1): above 1, reported as mean@N (their mean: the "
                               "expected pass@1) and pass@N (each question's best sample); needs --temperature above 0")
    evaluate.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: 0, greedy)")
    evaluate.add_argument("--seed", type=int, default=None, help="base of the per-sample seeds (default: 0)")
    evaluate.add_argument("--grammar", action=argparse.BooleanOptionalAction, default=None,
                          help="confine every turn to a well-formed action: what makes a tiny random model act "
                               "(default: on without --model, off with it; not for a trained checkpoint: it "
                               "changes what is measured)")

    track = subcommand(
        "evaluate-retriever", help="score the index alone on a converted benchmark's questions: page recall@k and "
                                   "nDCG@k, MMDocIR's page recall, ViDoRe's nDCG@10; BM25, dense and fused, both scopes",
    )
    track.add_argument("--data", type=Path, required=True, help="a converted benchmark or your own questions")
    track.add_argument("--index", type=Path, required=True, help="the retriever index (vrag-retriever index)")
    track.add_argument("--out", type=Path, required=True,
                       help="where to write retriever.jsonl, retriever_report.md and retriever_report.json")
    track.add_argument("--k", type=int, nargs="+", default=[1, 3, 5, 10], help="the cut-offs of recall@k and nDCG@k")
    track.add_argument("--scope", choices=["corpus", "document"], nargs="+", default=["corpus", "document"],
                       help="search the whole index, each question's own document, or both")
    track.add_argument("--retriever", choices=["bm25", "dense", "hybrid"], nargs="+", default=None,
                       help="the rankings to score (default: every one the index has: bm25; with a dense index "
                            "also dense and hybrid)")

    learn = subcommand(
        "learn", help="GRPO on CPU with a tiny model: roll out, score, update the HF model, sync it into the engine, "
                      "check; writes metrics.jsonl, reward.png, final/ and eval.pt",
    )
    learn.add_argument("--out", type=Path, default=Path("artifacts/learn"),
                       help="output directory: metrics.jsonl, reward.png, final/ (the trained model), eval.pt")
    learn.add_argument("--steps", type=int, default=LEARN_DEFAULTS["steps"], help="GRPO steps")
    learn.add_argument("--batch-size", type=int, default=LEARN_DEFAULTS["batch_size"],
                       help="number of questions (prompts) per step")
    learn.add_argument("--n", type=int, default=LEARN_DEFAULTS["n"], help="samples per question (the GRPO group)")
    learn.add_argument("--max-turns", type=int, default=LEARN_DEFAULTS["max_turns"], help="generation turns per episode")
    learn.add_argument("--response-length", type=int, default=LEARN_DEFAULTS["response_length"],
                       help="token budget of an episode's response (sampled text and observations)")
    learn.add_argument("--temperature", type=float, default=LEARN_DEFAULTS["temperature"],
                       help="sampling temperature (the update's log-probs use the same)")
    learn.add_argument("--lr", type=float, default=LEARN_DEFAULTS["lr"], help="AdamW learning rate")
    learn.add_argument("--seed", type=int, default=0, help="seeds the sampling and the HF model's update")
    learn.add_argument("--retriever-url", default=None, help="use a running retriever instead of the embedded one")
    learn.add_argument("--fixtures", default=None, help="replay recorded retriever traffic from this file")
    learn.add_argument("--family", choices=FAMILY_NAMES, default=None, help="tiny model family (default qwen2-vl)")
    learn.add_argument("--model", default=None, help="a local checkpoint of a supported family instead")
    learn.add_argument("--action-format", choices=("tags", "tool_call"), default="tags",
                       help="tags: <fetch>/<answer> in one turn; tool_call: the chat template's own tool calls")
    learn.add_argument("--data", type=Path, default=None,
                       help="your questions instead of the find-the-page task: a parquet from convert-dataset "
                            "(the first --batch-size rows)")
    learn.add_argument("--grammar", action=argparse.BooleanOptionalAction, default=None,
                       help="with --data: confine each turn to a search, a fetch or an answer, as rollout does "
                            "(default: on for a tiny model, which otherwise never acts; off for --model)")
    learn.add_argument("--index", type=Path, default=None,
                       help="serve this retriever index (vrag-retriever index) instead of the sample corpus's")
    learn.add_argument("--save-every", type=int, default=10,
                       help="save the weights and optimizer every N steps and after the last, under "
                            "OUT/checkpoints/step_NNNNN (0: none)")
    learn.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its latest checkpoint, up to --steps")
    learn.add_argument("--estimator", choices=("grpo", "turn", "gigpo"), default=None,
                       help="advantage estimator (docs/learning.md, 'Credit per turn'): grpo (the episode's reward, "
                            "the default), turn (reward-to-go, leave-one-out baseline), gigpo (step groups by pages seen)")
    learn.add_argument("--turn-rewards", choices=("off", "retrieval", "on"), default=None,
                       help="per-turn rewards (core/turn_rewards.py): off (the episode's reward on its last turn), "
                            "retrieval (its retrieval part to the turns that showed the pages), on (and shaping)")
    learn.add_argument("--task", choices=("page", "two-pages"), default="page",
                       help="without --data: find-the-page, or the two-pages credit task")
    learn.add_argument("--guard", choices=("fail", "drop", "warn", "off"), default="drop",
                       help="the live guard on every batch (README, 'The live guard'): stop the run, drop bad samples "
                            "from the loss, only report them, or skip the checks")
    _retriever_preflight(learn)
    context_budget_flags(learn)

    record = subcommand(
        "record-fixtures", help="record every retriever call the demo (or, with --data, a converted dataset) can "
                                "make from a live server, for replay"
    )
    record.add_argument("--out", type=Path, required=True, help="the fixture file to write (JSON)")
    record.add_argument("--retriever-url", default=None,
                        help="default: the embedded server on the sample corpus (with --data: on --index)")
    record.add_argument("--data", type=Path, default=None,
                        help="a parquet from convert-dataset: record fetches of every page of its documents, and "
                             "the --queries searches, instead of the demo's calls (vrag_rollout.data.fixture_calls)")
    record.add_argument("--index", type=Path, default=None,
                        help="with --data: the retriever index (page counts; served for the recording unless "
                             "--retriever-url)")
    record.add_argument("--queries", type=Path, default=None,
                        help="with --data: search queries, one per line, recorded in every dataset document")
    record.add_argument("--top-n", type=int, default=None,
                        help="with --data: the replaying run's top_n (searches are keyed by it; default: the "
                             "rollout config's)")

    build = subcommand("build-tiny-model", help="build a tiny offline model of a family (demo and tests)")
    build.add_argument("out_dir", type=Path, nargs="?", default=None,
                       help="where to build it (default: the cache the demo uses); prints the directory")
    build.add_argument("--family", choices=FAMILY_NAMES, default="qwen2-vl", help="the model family to build")
    build.add_argument("--shape", choices=TINY_SHAPES, default="compact",
                       help="compact (default): a small vocabulary, special tokens at ids that are not the released "
                            "ones; released: the released ids and logits width (docs/tiny-models.md)")

    check = subcommand(
        "check", help="verify a saved rollout batch (or a pickled trainer DataProto) against the model's own code"
    )
    check.add_argument("file", type=Path, help="a saved batch (docs/saved-batch.md) or a pickled trainer DataProto")
    check.add_argument("--model", default=None,
                       help="the model directory (its config, processor and weights); default: the one the batch "
                            "records")
    check.add_argument("--forward", action="store_true", help="also compare rollout logprobs with a forward pass")
    check.add_argument("--forward-tolerance", type=float, default=1e-3, help="largest logprob gap that passes")

    view = subcommand("view", help="write a self-contained HTML page of a saved rollout batch")
    view.add_argument("file", type=Path, help="a saved batch (docs/saved-batch.md) or a pickled trainer DataProto")
    view.add_argument("-o", "--out", type=Path, required=True, help="the HTML file to write")
    view.add_argument("--model", default=None,
                      help="decode with this model's tokenizer (default: the batch's own token texts)")
    view.add_argument("--truths", type=Path, default=None,
                      help="ground truths for a batch without a ground_truth column, matched by question: a "
                           "convert-dataset parquet or a JSON object {question: answer or {answer, doc_id, gold_pages}}")

    convert = subcommand(
        "convert-dataset", help="document-QA questions (VRAG-style JSON, or a public set's own file) -> the EasyR1 "
                                "trainer's parquet (vrag_rollout.data.dataset, vrag_rollout.data.sources)"
    )
    convert.add_argument("source", type=Path,
                         help='the questions: with --from vidoseek a JSON array, {"data": [...]}, {"examples": [...]} '
                              "or JSON Lines of VRAG-style questions; otherwise the set's own released file")
    convert.add_argument("--from", dest="source_format",
                         choices=["vidoseek", "slidevqa", "mmlongbench-doc", "mmdocir", "longdocurl"],
                         default=None,
                         help="the source's layout (left out: your own questions in the vidoseek layout): vidoseek "
                              "(VRAG-style: uid, query, reference_answer, meta_info), "
                              "slidevqa (annotations/qa/*.jsonl), mmlongbench-doc (data/samples.json), mmdocir "
                              "(MMDocIR_annotations.jsonl), longdocurl (LongDocURL*.jsonl); each set's fields and "
                              "page numbering are read as it releases them (vrag_rollout/data/sources.py)")
    convert.add_argument("--scope", choices=["corpus", "document"], default=None,
                         help="what the agent searches: the whole index (corpus: no doc_id, gold pages as "
                              "[document, page]) or each question's own document; default: the set's own protocol, "
                              "corpus for --from vidoseek and slidevqa (VRAG-RL's), document otherwise (the vidoseek "
                              "layout without --from included); a question with no meta_info (no document) "
                              "converts in corpus scope only")
    convert.add_argument("--documents", type=Path, default=None,
                         help="also write here (JSON) the documents the index must hold: doc_id, file or folder "
                              "name, and whether it is a PDF or a folder of page images")
    convert.add_argument("--out", type=Path, required=True, help="the parquet file to write")
    convert.add_argument("--index", type=Path, default=None,
                         help="a retriever index directory: report questions whose document it lacks and "
                              "check gold pages against its page counts")
    convert.add_argument("--report", type=Path, default=None, help="also write the report as JSON here")
    convert.add_argument("--page-base", type=int, choices=[0, 1], default=1,
                         help="first page number in the source's reference_page (written 1-based); --from "
                              "vidoseek only: the other sets' page numbering is known")
    convert.add_argument("--drop-missing", action="store_true",
                         help="leave out (and report) questions whose document is not in --index or whose gold "
                              "pages pass its end (without it, such a page stops the conversion)")
    convert.add_argument("--action-format", choices=["tags", "tool_call"], default="tags",
                         help="the instructions written into each prompt (match worker.rollout.action_format)")
    convert.add_argument("--region-action", action="store_true",
                         help="the instructions teach the region action too (match worker.rollout.region_action)")
    convert.add_argument("--val-out", type=Path, default=None,
                         help="also write a validation parquet here, with --val-fraction of the questions "
                              "(the rest go to --out)")
    convert.add_argument("--val-fraction", type=float, default=0.1,
                         help="share of the questions (or documents, --split-by document) in --val-out")
    convert.add_argument("--split-by", choices=["question", "document"], default="question",
                         help="split by question, or keep each document's questions on one side")
    convert.add_argument("--layout", choices=["easyr1", "verl"], default="easyr1",
                         help="the trainer's dataset columns: EasyR1's, or verl's agent-loop rows (docs/verl.md)")
    convert.add_argument("--merge", type=Path, action="append", default=None, metavar="CONVERTED",
                         help="merge converted files instead: SOURCE and each --merge file (convert-dataset outputs) "
                              "into one corpus-scope file over --index, the sets' documents indexed together; each "
                              "row keeps its set, document and source file (VRAG-RL's merged corpus)")
    return parser


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand `name`: its usage errors print its own usage line."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


ENGINE_COMMANDS = ("demo", "rollout", "learn", "evaluate")


def quiet_cpu_start() -> None:
    """On a machine without a GPU, keep torch's C++ log to errors (a user's own setting wins):
    vLLM's CPU worker prints a NUMA-binding notice through it at start, straight to stderr and
    before any Python logger could filter it. Set before torch is imported, which reads it once."""
    import glob

    if not glob.glob("/dev/nvidia[0-9]*"):
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def main(argv: Optional[Sequence[str]] = None) -> int:
    top = build_parser()
    args = top.parse_args(argv)
    parser = subcommand_parser(top, args.command)
    # vLLM's CPU worker logs a warning on every generate call; keep the demo's output readable.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from .progress import LOGGER, show_on

    shown = None
    if args.command in ENGINE_COMMANDS:
        quiet_cpu_start()
        shown = show_on()  # what is starting and how far a batch is, on stderr
    from .devkit.job_checks import JobInputError

    try:
        return _run(args, parser)
    except JobInputError as error:  # an expected user error: one line, no traceback
        print(f"vrag-rollout {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:
        if shown is not None:  # main may run again in this process (tests), with other streams
            LOGGER.removeHandler(shown)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command in ("demo", "learn", "rollout") and args.model is not None:
        from .devkit.demo import demo_model

        from .devkit.job_checks import JobInputError

        try:  # one line, not a traceback nor a usage tail, for a model directory that cannot be run
            demo_model(args.family, args.model)
        except (FileNotFoundError, ValueError) as error:
            raise JobInputError(f"--model {error}" if not str(error).startswith("--model") else str(error)) from None
    if args.command == "demo":
        return _demo(args)
    if args.command == "rollout":
        from .devkit.rollout_job import run_rollout

        run_rollout(args.out, data=args.data, index=args.index, retriever_url=args.retriever_url,
                    fixtures=args.fixtures, model=args.model, family=args.family, batch_size=args.batch_size,
                    n=args.n, max_turns=args.max_turns, response_length=args.response_length,
                    temperature=args.temperature, seed=args.seed, action_format=args.action_format,
                    region_action=args.region_action, grammar=args.grammar, prompt_length=args.prompt_length,
                    retriever_preflight=args.retriever_preflight, offset=args.offset,
                    context=context_settings(args))
        return 0
    if args.command == "learn":
        return _learn(args, parser)
    if args.command == "evaluate":
        return _evaluate(args, parser)
    if args.command == "evaluate-retriever":
        from .devkit.evaluate_retriever_job import run_retriever_track
        from .evaluation.retriever_track import markdown as track_markdown

        if min(args.k) < 1:
            from .devkit.job_checks import JobInputError

            raise JobInputError(f"--k must be at least 1, got {min(args.k)}")
        report = run_retriever_track(args.out, data=args.data, index=args.index, ks=sorted(set(args.k)),
                                     scopes=args.scope, retrievers=args.retriever)
        print(track_markdown(report), end="")
        return 0
    if args.command == "record-fixtures":
        return _record_fixtures(args, parser)
    if args.command == "build-tiny-model":
        from .devkit.tiny_model import build_tiny_model, default_model_dir
        from .devkit.job_checks import JobInputError

        try:
            out_dir = args.out_dir or default_model_dir(args.family, args.shape)
            print(build_tiny_model(out_dir, args.family, shape=args.shape))
        except OSError as error:  # a directory that cannot be written
            raise JobInputError(f"{args.out_dir}: cannot build the model there ({error.strerror or error})") from error
        return 0
    if args.command == "check":
        from .verify.check import main as check_main

        return check_main(str(args.file), args.model, forward=args.forward, forward_tolerance=args.forward_tolerance)
    if args.command == "view":
        from .verify.view import main as view_main

        return view_main(args.file, args.out, model_dir=args.model, truths=args.truths)
    if args.command == "convert-dataset" and args.merge:
        from .data.merge import merge_command

        return merge_command([args.source, *args.merge], args.out, args.index)
    if args.command == "convert-dataset":
        from .data.convert_command import convert_dataset_command

        if args.val_out is not None and not 0 < args.val_fraction < 1:
            from .devkit.job_checks import JobInputError

            raise JobInputError(f"--val-fraction must be between 0 and 1, got {args.val_fraction}")
        return convert_dataset_command(args.source, args.out, index_dir=args.index, report_path=args.report,
                                       page_base=args.page_base, drop_missing=args.drop_missing,
                                       action_format=args.action_format, val_out=args.val_out,
                                       val_fraction=args.val_fraction if args.val_out is not None else 0.0,
                                       split_of=args.split_by, layout=args.layout,
                                       source_format=args.source_format, documents_path=args.documents,
                                       region_action=args.region_action, scope=args.scope)
    return 2


DEMO_HINT = ("the demo asks the sample corpus's questions; for your own documents and questions run "
             "`vrag-rollout rollout --data QUESTIONS.parquet --retriever-url URL` (or --index DIR)")

RECORD_HINT = ("without --data, record-fixtures records every call the demo can make on the sample corpus; for "
               "your own documents pass --data QUESTIONS.parquet")


def _demo(args: argparse.Namespace) -> int:
    from .devkit.demo import demo_questions, run_demo
    from .devkit.job_checks import RetrieverSource, check_retriever

    if args.retriever_url is not None or args.fixtures is not None:  # the embedded one is the demo's own
        source = RetrieverSource(url=args.retriever_url, fixtures=args.fixtures)
        docs = [sample.doc_id for sample in demo_questions()[:args.batch_size]]
        check_retriever(source, docs, mode=args.retriever_preflight, hint=DEMO_HINT)
    run_demo(args.out, family=args.family, model=args.model, batch_size=args.batch_size,
             retriever_url=args.retriever_url, fixtures=args.fixtures, n=args.n, max_turns=args.max_turns,
             response_length=args.response_length, seed=args.seed, rollout_mode=args.rollout_mode,
             action_format=args.action_format, region_action=args.region_action,
             retriever_preflight=args.retriever_preflight, **context_settings(args))
    return 0


def _evaluate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .devkit.evaluate_job import run_evaluation
    from .devkit.job_checks import JobInputError
    from .evaluation.protocols import named
    from .evaluation.report import headline

    if args.compare is not None:
        from .devkit.evaluate_job import compare_runs

        print(compare_runs(*args.compare), end="")
        return 0
    if args.data is None or args.out is None:
        parser.error("the following arguments are required: --data, --out (or --compare RUN_A RUN_B)")
    # a bad value is one line naming its flag (JobInputError), not a usage message
    for name in ("max_turns", "response_length", "top_n", "batch_size", "limit", "n"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise JobInputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.temperature is not None and args.temperature < 0:
        raise JobInputError(f"--temperature must be at least 0, got {args.temperature}")
    context_settings(args)
    if (args.n or 1) > 1 and not args.temperature:
        raise JobInputError(f"--n {args.n} at --temperature 0 draws the same answer {args.n} times: give a "
                            "--temperature above 0 for pass@k")
    given = {name: getattr(args, name) for name in ("scope", "max_turns", "capped", "unanswerable", "response_length",
                                                    "top_n", "n", "temperature", "seed", *CONTEXT_BUDGET)}
    if args.search_required is not None:
        given["search_required"] = {"set": None, "on": True, "off": False}[args.search_required]
    protocol = named(args.protocol, {name: value for name, value in given.items() if value is not None
                                     or name == "search_required"})
    report = run_evaluation(args.out, data=args.data, model=args.model, family=args.family, protocol=protocol,
                            index=args.index, retriever_url=args.retriever_url, batch_size=args.batch_size,
                            limit=args.limit, grammar=args.grammar, judge_model=args.judge)
    for line in headline(report):
        print(line)
    print(f"report: {args.out / 'report.md'} (results: {args.out / 'results.jsonl'})")
    return 0


def _learn(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .devkit.job_checks import JobInputError, RetrieverSource, check_retriever
    from .devkit.learn_job import check_settings, learn_questions, run_learn

    settings = dict(steps=args.steps, batch_size=args.batch_size, n=args.n, max_turns=args.max_turns,
                    response_length=args.response_length, temperature=args.temperature, lr=args.lr)
    sources = dict(data=args.data, index=args.index)
    try:
        check_settings(**settings, **sources, out_dir=args.out, resume=args.resume, save_every=args.save_every)
    except ValueError as error:  # a value, not the usage: one line, no usage tail, the prefix once
        raise JobInputError(str(error).removeprefix("vrag-rollout learn: ")) from None
    if args.task != "page" and args.data is not None:  # the task brings its own questions and grammar
        raise JobInputError(f"--task {args.task} asks its own questions: it cannot learn from --data as well")
    context = context_settings(args)
    samples, _truths, page_counts = learn_questions(args.data, args.batch_size, args.action_format)
    embedded = args.retriever_url is None and args.fixtures is None
    index = args.index
    if embedded and index is None:
        from .devkit.demo import cache_dir, prepare_index

        index = prepare_index(cache_dir())
    source = RetrieverSource(index=index if embedded else None, url=args.retriever_url, fixtures=args.fixtures)
    hint = ("without --index, learn serves the sample corpus's index: pass the index of your documents"
            if embedded and args.index is None and args.data is not None else "")
    check_retriever(source, [sample.doc_id for sample in samples], page_counts, args.retriever_preflight, hint)
    run_learn(args.out, **settings, seed=args.seed, family=args.family, model=args.model,
              retriever_url=args.retriever_url, fixtures=args.fixtures, action_format=args.action_format,
              retriever_preflight=args.retriever_preflight, guard=args.guard, grammar=args.grammar,
              save_every=args.save_every, resume=args.resume, estimator=args.estimator,
              turn_rewards=args.turn_rewards, task=args.task, context=context, **sources)
    return 0


def _record_fixtures(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.data is not None:
        if args.index is None and args.retriever_url is None:
            parser.error("record-fixtures --data needs --index (served for the recording) or --retriever-url")
        from .data.fixture_calls import record_dataset_command

        return record_dataset_command(args.data, args.out, queries=args.queries, retriever_url=args.retriever_url,
                                      index_dir=args.index, top_n=args.top_n)
    given = [flag for flag, value in (("--index", args.index), ("--queries", args.queries),
                                      ("--top-n", args.top_n)) if value is not None]
    if given:
        parser.error(f"record-fixtures {' '.join(given)}: only with --data (the demo's calls are fixed)")
    from .devkit.demo import demo_questions, record_demo_fixtures
    from .devkit.job_checks import JobInputError, RetrieverSource, retriever_problem

    if args.retriever_url is not None:  # every demo document is recorded: the server must hold them all
        docs = [sample.doc_id for sample in demo_questions()]
        if (problem := retriever_problem(RetrieverSource(url=args.retriever_url), docs, hint=RECORD_HINT)) is not None:
            raise JobInputError(problem)
    print(record_demo_fixtures(args.out, args.retriever_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
