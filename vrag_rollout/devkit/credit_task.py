"""The learn task where credit matters (`vrag-rollout learn --task two-pages`): two gold pages,
each found by a turn of its own, among distractors.

Each question names two facts of one sample-corpus document, printed on pages `GOLD_PAGES` (2 and
4, in each of the three sample documents); the answer is both page numbers ("2 4"). The episode
fetches one page a turn (`<fetch>image, N</fetch>`, N from 1 to `MAX_PAGE`; pages 1, 3 and 5 are
distractors) and answers one or two page numbers (`<answer>N</answer>` or `<answer>N M</answer>`),
as the action grammar (`credit_regex`) allows. The project's reward (default weights): accuracy
0.5 for "2 4" (normalised exact match, so order matters), F1 0.3 (a single right page earns part
of it), format 0.1, retrieval 0.1: the NDCG of the pages shown against both gold pages.

Why credit matters here: a turn that fetches a gold page earns it, whatever the other turns do;
with per-turn rewards (`--turn-rewards`) that turn is paid when it acts, and an episode that found
one gold page and then repeated it differs from one that found both by the turn that differs.
Episode-level GRPO sees only the total.
"""

from __future__ import annotations

from ..data.prompts import PromptSample
from ..formats import format_named
from .learn_task import MAX_PAGE

GOLD_PAGES = (2, 4)
TASKS = ("page", "two-pages")

CREDIT_INSTRUCTIONS = (
    "Find the two pages of the document that cover the question. Fetch a page with <fetch>image, N</fetch> "
    "to see it (pages start at 1), one page a turn, then give both page numbers, smaller first, inside "
    "<answer></answer>, e.g. <answer>1 3</answer>."
)


def credit_facts() -> list[tuple[str, str, str]]:
    """(fact on page 2, fact on page 4, doc_id) for each sample document that has both."""
    from retriever_server.sample_corpus import SAMPLE_FACTS

    by_page = {(doc, page): fact for fact, (doc, page) in SAMPLE_FACTS.items()}
    docs = sorted({doc for doc, _ in by_page})
    return [(by_page[(doc, GOLD_PAGES[0])], by_page[(doc, GOLD_PAGES[1])], doc) for doc in docs
            if all((doc, page) in by_page for page in GOLD_PAGES)]


def credit_questions(count: int) -> tuple[list[PromptSample], list[dict]]:
    facts = credit_facts()
    if not 1 <= count <= len(facts):
        raise ValueError(f"the two-pages task has {len(facts)} questions; asked for {count}")
    samples, truths = [], []
    for first, second, doc in facts[:count]:
        samples.append(PromptSample(question=f"Which two pages cover {first} and {second}?", doc_id=doc,
                                    instructions=CREDIT_INSTRUCTIONS))
        truths.append({"answer": " ".join(map(str, GOLD_PAGES)), "doc_id": doc, "gold_pages": list(GOLD_PAGES)})
    return samples, truths


def credit_regex(action_format: str = "tags", max_page: int = MAX_PAGE) -> str:
    """Every turn one action: fetch a page, or answer one or two page numbers."""
    if format_named(action_format).renders_tools:
        raise ValueError("the two-pages task is written for the tags format")
    pages = f"[1-{max_page}]"
    return f"({format_named(action_format).regex_fetch(pages, modes='image')}|<answer>{pages}( {pages})?</answer>)"


__all__ = ["CREDIT_INSTRUCTIONS", "GOLD_PAGES", "TASKS", "credit_facts", "credit_questions", "credit_regex"]
