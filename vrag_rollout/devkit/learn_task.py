"""The task `vrag-rollout learn` trains on by default: find the page, through the retriever.

The task: each question asks which page of a sample-corpus document covers a fact
(`retriever_server.sample_corpus.SAMPLE_FACTS`); the task's questions are the facts printed on
page `TASK_PAGE` of each sample document, and the ground truth is that page. The episode may fetch
a page (`<fetch>image, N</fetch>`, or the `fetch` tool in the native format), sees the page the
retriever returns, and answers with a page number (`<answer>N</answer>`). The project's reward
(`core/reward.py`, default weights) pays 0.5 + 0.3 for the right page in the answer (accuracy, F1),
0.1 for a well-formed episode and 0.1 for retrieval: the NDCG of the pages the retriever actually
showed (the rollout's `page_ids`), so fetching the gold page first earns it, and a fetch past the
document's end (an error observation, no page) earns nothing.

Why a tiny random model can learn it: the grammar (`task_regex`) confines every turn to a fetch or
an answer of pages 1..MAX_PAGE, so every episode is well formed and the policy's whole choice is a
few page tokens per turn; a random policy answers the right page about one time in MAX_PAGE. The
questions share their gold page, so what GRPO's group-normalised advantage pushes for one question
also helps the others, and the reward can reach 1.0 (fetch page 3, then answer 3).
What it cannot learn in minutes: a different page per question. Measured on two cores with the
Qwen2-VL tiny model (hidden size 128), three questions with three different gold pages rose only
from about 0.33 to 0.47 in 60 steps, the policy settling on one page for all: a random 128-wide
network barely tells the questions apart at the answer's position.
"""

from __future__ import annotations

from typing import Optional

from ..data.prompts import PromptSample
from ..formats import format_named

TASK_PAGE = 3  # where every task question's evidence is, in each of the three sample documents
MAX_PAGE = 5  # the longest sample document's length; shorter ones answer a fetch past their end with an error

TASK_INSTRUCTIONS = (
    "Find the page of the document that covers the question. Fetch a page with <fetch>image, N</fetch> "
    "to see it (pages start at 1), then give the page number inside <answer></answer>."
)

TOOL_CALL_TASK_INSTRUCTIONS = (
    "Find the page of the document that covers the question. Call fetch to see a page (pages start "
    "at 1), then give the page number, without a tool call, inside <answer></answer>."
)


def task_facts() -> list[tuple[str, str, int]]:
    """(fact, doc_id, page) of every sample fact whose evidence is on `TASK_PAGE`, one per document."""
    from retriever_server.sample_corpus import SAMPLE_FACTS

    return sorted((fact, doc, page) for fact, (doc, page) in SAMPLE_FACTS.items() if page == TASK_PAGE)


def task_questions(count: int, instructions: Optional[str] = None) -> tuple[list[PromptSample], list[dict]]:
    """The first `count` task questions and their ground truths (`core.reward`'s JSON form)."""
    facts = task_facts()
    if not 1 <= count <= len(facts):
        raise ValueError(f"the find-the-page task has {len(facts)} questions; asked for {count}")
    samples, truths = [], []
    for fact, doc, page in facts[:count]:
        samples.append(PromptSample(question=f"Which page covers {fact}?", doc_id=doc,
                                    instructions=instructions or TASK_INSTRUCTIONS))
        truths.append({"answer": str(page), "doc_id": doc, "gold_pages": [page]})
    return samples, truths


# The task's instructions in each action format's words.
INSTRUCTIONS_BY_FORMAT = {"tags": TASK_INSTRUCTIONS, "tool_call": TOOL_CALL_TASK_INSTRUCTIONS}


def task_instructions(action_format: str) -> str:
    """The task's instructions for `action_format` (`INSTRUCTIONS_BY_FORMAT`)."""
    format_named(action_format)  # an unknown format's error names the known ones
    return INSTRUCTIONS_BY_FORMAT[action_format]


def task_regex(action_format: str = "tags", max_page: int = MAX_PAGE) -> str:
    """Every turn one action: fetch a page (as an image) or answer a page number."""
    pages = f"[1-{max_page}]"
    return f"({format_named(action_format).regex_fetch(pages, modes='image')}|<answer>{pages}</answer>)"


__all__ = ["MAX_PAGE", "TASK_INSTRUCTIONS", "TOOL_CALL_TASK_INSTRUCTIONS", "task_facts", "task_instructions",
           "task_questions", "task_regex"]
