"""What every action format shares: its instructions with the region action's sentence added."""

from __future__ import annotations


class FormatBase:
    name: str
    instructions: str  # the prompt's default instructions
    region_instructions: str  # the sentence added with the region action

    @classmethod
    def instructions_for(cls, region_action: bool = False) -> str:
        return cls.instructions + cls.region_instructions if region_action else cls.instructions
