"""Token budget: an arm's longest prompt must fit its engine's context, checked before it plays.

The prompts are rendered for the last round with a full history of wide numbers (the longest
an agent can be shown); the engine counts their tokens as it will send them (chat template
included) and adds the reasoning and answer budgets. Engines that cannot count tokens
locally (servers, the simulated engine) are not checked.
"""

from __future__ import annotations

import polars as pl

from core.game import history_row
from design.arms import Arm
from design.seen import seen
from prompts.context import agent_variables
from prompts.render import render_distinct

#: Distinct prompts counted per arm: the longest by characters (a million personas may
#: render a million distinct prompts; tokens grow with characters).
LONGEST = 16


def longest_prompts(arm: Arm, personas: pl.DataFrame) -> list[str]:
    """The arm's longest distinct prompts, as rendered in its last round with the widest numbers."""
    rule = arm.rule
    last = rule.rounds
    wide = max(rule.high - 0.01, rule.low)  # means and targets show two decimals
    n = personas.height
    history = [history_row(r, n, wide, wide, n) for r in range(1, last)]
    shared, agents = seen(rule, personas, last, history, own_guesses=[float(rule.high)] * (last - 1) if last > 1 else None)
    distinct = render_distinct(arm.mode.template, shared, agent_variables(agents))
    return sorted(distinct, key=len, reverse=True)[:LONGEST]


def check_context(arm: Arm, personas: pl.DataFrame) -> None:
    """Refuse an arm whose longest prompt, reasoning and answer exceed its engine's context.

    Raises:
        ValueError: one line naming the engine setting, the tokens needed and the limit.
    """
    reserve = arm.max_answer_tokens + (arm.max_reasoning_tokens + 16 if arm.mode.reasoning else 0)  # 16: the final cue
    arm.engine.check_context(longest_prompts(arm, personas), reserve, arm.prompt_mode)
