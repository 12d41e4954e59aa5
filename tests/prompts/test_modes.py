"""Prompt modes: every template renders, says what its mode promises, and documents
the variables it uses in its header comment."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from core.game import GameRule
from design.arms import Arm, check_prompt_inputs
from prompts.context import game_context, groups_context, population_context
from prompts.modes import MODES, TEMPLATE_DIR, custom_mode, get_mode
from prompts.render import render, template_variables

pytestmark = pytest.mark.quick

PERSONAS = pl.DataFrame(
    {
        "agent_id": [0, 1, 2, 3, 4],
        "education": ["Ph.D.", "High School", "High School", "Ph.D.", "High School"],
        "background": ["I taught game theory for 30 years.", "I fix cars.", "I bake.", "I write.", "I run."],
    }
)


def shared(rule: GameRule = GameRule(), round_: int = 1, history=(), personas=PERSONAS) -> dict:
    return {"game": game_context(rule, personas.height), "round": round_, "history": list(history),
            "population": population_context(personas)}


def agents(personas=PERSONAS) -> pl.DataFrame:
    return personas.select(pl.struct("education", "background").alias("persona"))


def one(mode: str, **kwargs) -> str:
    return render(get_mode(mode).template, shared(**kwargs), agents())[0]


def test_the_built_in_prompt_modes_exist_and_all_but_basic_reason_first():
    assert {"basic", "cot", "cot_rational", "cot_strategic", "note", "background", "population"} <= set(MODES)
    assert not MODES["basic"].reasoning and all(MODES[m].reasoning for m in MODES if m != "basic")


@pytest.mark.parametrize("mode", list(MODES))
def test_every_variable_a_template_uses_is_documented_in_its_header(mode):
    path = TEMPLATE_DIR / MODES[mode].template
    header = re.match(r"\{#-?(.*?)-?#\}", path.read_text(), re.S).group(1)
    assert header.strip().startswith(f"{mode}:")
    documented = set(re.findall(r"[a-z_]+", header.split("Variables:")[1]))
    used = template_variables(MODES[mode].template)
    assert used <= documented, f"{mode} uses {sorted(used - documented)} without documenting them"


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_renders_the_rules_first(mode):
    text = one(mode)
    assert text.startswith("You are playing a number-guessing game with 5 players.")
    assert "closest to 2/3 of the average" in text


def test_each_mode_says_what_it_promises():
    assert one("basic").endswith("My number is:")
    assert "step by step" in one("cot") and "rational" not in one("cot")
    assert "All players are rational." in one("cot_rational")
    assert "guess the strategies of the other players" in one("cot_strategic")
    note = one("note", rule=GameRule(ratio="51/100"))
    assert "closest to 51/100 of the average" in note
    assert "variation of the famous guess-2/3-of-the-average game" in note
    assert "Your background: I taught game theory for 30 years." in one("background")
    assert "Strictly follow your character." in one("background") and "Strictly follow your character." in one("persona")
    assert "- Education: Ph.D." in one("persona")
    assert "I taught" not in one("persona") and "I taught" not in one("basic")  # backstories only in background


def test_offset_game_is_described_with_its_offset():
    assert "closest to 5 + 1/2 of the average" in one("basic", rule=GameRule(ratio="1/2", offset=5))


def test_population_mode_tells_the_composition():
    text = one("population")
    assert "The 5 players are a diverse population:" in text
    assert "- by education: 3 High School; 2 Ph.D." in text
    big = pl.DataFrame({"agent_id": range(1000), "education": ["Elementary School", "High School", "Bachelor's Degree",
                                                               "Master's Degree", "Ph.D."] * 200})
    context = population_context(big)
    assert context["n"] == "1,000"
    assert {c["count"] for c in context["attributes"]["education"]} == {"200"}
    assert "agent_id" not in context["attributes"]


def test_multi_round_prompts_announce_the_winner_and_own_guesses():
    history = [{"round": 1, "mean": 48.123, "winning_guess": 32.0}, {"round": 2, "mean": 30.5, "winning_guess": 20.0}]
    frame = agents().with_columns(own_guesses=pl.Series([[35.0, 25.0]] * 5))
    text = render("cot.j2", shared(GameRule(rounds=5), round_=3, history=history), frame)[0]
    assert "This is round 3 of 5." in text
    assert "In round 1, the average was 48.12 and the winning number was 32; you named 35." in text
    assert "In round 2, the average was 30.5 and the winning number was 20; you named 25." in text


def test_grouped_agents_are_told_their_group_and_its_results():
    personas = PERSONAS.with_columns(group=pl.Series(["A", "B", "B", "A", "B"]))
    history = {"A": [{"round": 1, "mean": 60.0, "winning_guess": 40.0}], "B": [{"round": 1, "mean": 30.0, "winning_guess": 20.0}]}
    context = shared(round_=2, history=[{"round": 1, "mean": 42.0, "winning_guess": 28.0}]) | {"groups": groups_context(personas, history)}
    texts = render("basic.j2", context, personas.select(pl.struct("education").alias("persona"), "group"))
    assert 'You play in group "A" with 2 players' in texts[0]
    assert "the average in your group was 60 and the winning number was 40" in texts[0]
    assert 'You play in group "B" with 3 players' in texts[1]
    assert "the winning number was 20" in texts[1] and "28" not in texts[1]


def test_background_mode_without_backstories_fails_clearly():
    arm = Arm(0, "r", None, "background", 0.7, GameRule())
    check_prompt_inputs(arm, PERSONAS)  # every persona has a backstory
    with pytest.raises(ValueError, match="mode 'background' shows each persona's backstory, but the personas have none"):
        check_prompt_inputs(arm, PERSONAS.with_columns(background=pl.lit(None, pl.String)))
    with pytest.raises(ValueError, match="have none"):
        check_prompt_inputs(arm, PERSONAS.drop("background"))
    check_prompt_inputs(Arm(0, "r", None, "cot", 0.7, GameRule()), PERSONAS.drop("background"))


def test_a_custom_template_is_a_mode(tmp_path: Path):
    path = tmp_path / "mine.j2"
    path.write_text('{% include "_rules.j2" %}\n\nYou are a contrarian. Your number:')
    mode = custom_mode("contrarian", str(path), reasoning=False)
    text = render(mode.template, shared(), agents())[0]
    assert text.startswith("You are playing") and text.endswith("You are a contrarian. Your number:")
    with pytest.raises(ValueError, match="not found"):
        custom_mode("x", str(tmp_path / "missing.j2"), True)
    with pytest.raises(ValueError, match="built-in mode"):
        custom_mode("cot", str(path), True)
