"""What every action format shares: its instructions, per search scope, with the region action's
sentence added.

Scopes (`SCOPES`, see `core.scope`): "document", a row that names its document (every call reads
it), and "corpus", a row without one (a search ranks the whole index; a fetch or crop reads the
document of the last page shown). The grammar is the same in both; only the instructions say
which.
"""

from __future__ import annotations

SCOPES = ("document", "corpus")


class FormatBase:
    name: str
    instructions: str  # the prompt's default instructions (document scope)
    corpus_instructions: str  # the same for a question over the whole corpus
    region_instructions: str  # the sentence added with the region action

    @classmethod
    def instructions_for(cls, region_action: bool = False, scope: str = "document") -> str:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        text = cls.corpus_instructions if scope == "corpus" else cls.instructions
        return text + cls.region_instructions if region_action else text
