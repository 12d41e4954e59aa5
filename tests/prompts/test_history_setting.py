"""``game.history``: what agents are told of earlier rounds — validated, applied to the prompts
(last N rounds, with or without own guesses, grouped agents), the default unchanged, and the
number of distinct prompts each setting gives (the README's table, counted here)."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest

from core.game import GameRule, History
from core.personas import attribute_columns
from design.config import ConfigError
from design.loading import load_config
from populations.sampler import sample
from populations.spec import load_spec
from prompts.context import agent_variables, round_variables, shown_own_guesses
from prompts.render import render
from tests.conftest import REPO

pytestmark = pytest.mark.quick

BASE = {"name": "history", "population": {"spec": "education.yaml", "size": 10}, "game": {"rounds": 5}}
PERSONAS = pl.DataFrame({"agent_id": [0, 1], "education": ["Ph.D.", "High School"]})
HISTORY = [{"round": 1, "mean": 48.123, "winning_guess": 32.0}, {"round": 2, "mean": 30.5, "winning_guess": 20.0},
           {"round": 3, "mean": 21.0, "winning_guess": 14.0}]
#: Round 3's basic prompt of agent 0, as keynes rendered it before game.history existed.
BEFORE = ("You are playing a number-guessing game with 2 players. Each player names an integer between 0 and 100. "
          "The player whose number is closest to 2/3 of the average of all numbers named wins.\n\n"
          "This is round 3 of 5.\n"
          "In round 1, the average was 48.12 and the winning number was 32; you named 35.\n"
          "In round 2, the average was 30.5 and the winning number was 20; you named 25.\n\n"
          "About you:\n- Education: Ph.D.\n\nAnswer with a single number.\nMy number is:")


def prompts(history: History | None, round_: int, personas: pl.DataFrame = PERSONAS, own=((35.0, 25.0, 15.0), (50.0, None, 9.0)),
            group_history=None, mode: str = "basic.j2") -> list[str]:
    """Round ``round_``'s prompts as ``tasks.play`` builds them (``history=None``: the rule's default)."""
    rule = GameRule(rounds=5) if history is None else GameRule(rounds=5, history=history)
    agents = personas.with_columns(own_guesses=pl.Series([list(o[: round_ - 1]) for o in own], dtype=pl.List(pl.Float64)))
    shared = round_variables(rule, personas, round_, HISTORY[: round_ - 1], group_history)
    return render(mode, shared, agent_variables(shown_own_guesses(agents, rule.history)))


# ---------------------------------------------------------------------------- the config
@pytest.mark.parametrize("written, rounds, own", [
    ({"rounds": "all", "own_guesses": True}, "all", True),
    ({"rounds": 2}, 2, True),
    ({"own_guesses": False}, "all", False),
    ({"rounds": 0, "own_guesses": False}, 0, False),
    ("all", "all", True), (3, 3, True), ("3", 3, True), ({"rounds": " ALL "}, "all", True),
])
def test_what_a_researcher_writes_is_read(written, rounds, own):
    history = load_config(BASE | {"game": {"rounds": 5, "history": written}}).game.history
    assert (history.rounds, history.own_guesses) == (rounds, own)


@pytest.mark.parametrize("history, message", [
    ({"rounds": -1}, "game.history.rounds: -1: expected all or a number of rounds (0 or more)"),
    ({"rounds": "last 2"}, "game.history.rounds: 'last 2': expected all or a number of rounds (0 or more)"),
    ({"rounds": 2.5}, "game.history.rounds: 2.5: expected all or a number of rounds (0 or more)"),
    ({"rounds": True}, "game.history.rounds: True: expected all or a number of rounds (0 or more)"),
    ({"own_guesses": "maybe"}, "game.history.own_guesses: 'maybe': input should be a valid boolean"),
    ({"round": 2}, "game.history.round: unknown key (did you mean 'rounds'?)"),
    (None, "game.history: None: expected all, a number of rounds, or {rounds: all | N, own_guesses: true | false}"),
    ([1], "game.history: [1]: expected all, a number of rounds"),
])
def test_bad_history_is_one_line_naming_the_field_and_value(history, message):
    with pytest.raises(ConfigError) as err:
        load_config(BASE | {"game": {"rounds": 5, "history": history}})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_bad_history_from_the_command_line_names_the_field():
    with pytest.raises(ConfigError, match=r"^game\.history\.rounds: 'some': expected all or a number"):
        load_config(BASE, ["game.history.rounds=some"])
    assert load_config(BASE, ["game.history.own_guesses=false"]).game.history == History(own_guesses=False)


def test_the_default_keeps_the_config_hash_of_configs_written_before_it():
    # Experiment ids as keynes computed them before game.history existed: old warehouses resume.
    assert load_config(BASE).experiment_id == "history-ac935cc5"
    assert load_config(BASE | {"game": {"rounds": 5, "history": {"rounds": "all", "own_guesses": True}}}).experiment_id == "history-ac935cc5"
    two_games = BASE | {"arms": {"games": [{}, {"ratio": "1/2", "offset": 5}]}}
    assert load_config(two_games).experiment_id == "history-838bba3e"
    changed = {load_config(BASE | {"game": {"rounds": 5, "history": h}}).config_hash for h in ({"rounds": 1}, {"own_guesses": False})}
    assert len(changed) == 2 and load_config(BASE).config_hash not in changed


def test_the_stored_config_holds_the_setting():
    # What the flow stores in experiments.config (cfg.model_dump), and reads back the same.
    stored = load_config(BASE | {"game": {"rounds": 5, "history": 1}}).model_dump(mode="json")
    assert stored["game"]["history"] == {"rounds": 1, "own_guesses": True}
    assert load_config(stored).game.history == History(rounds=1)


def test_the_setting_in_words():
    assert History().describe() == "every earlier round, with own guesses"
    assert History(rounds=1, own_guesses=False).describe() == "the last 1 round, without own guesses"
    assert History(rounds=3).describe() == "the last 3 rounds, with own guesses"
    assert History(rounds=0).describe() == "no earlier round (only the round number)"


# ---------------------------------------------------------------------------- the prompts
def test_the_default_renders_the_prompts_of_before_byte_for_byte():
    assert prompts(None, 3)[0] == BEFORE
    for round_ in (1, 2, 3, 4):
        assert prompts(None, round_) == prompts(History(rounds="all", own_guesses=True), round_)
    # and the lines the older prompt test asserts (tests/prompts/test_modes.py)
    assert "In round 1, the average was 48.12 and the winning number was 32; you named 35." in prompts(History(), 3, mode="cot.j2")[0]


def test_the_last_n_rounds_keep_their_round_numbers_and_own_guesses():
    text = prompts(History(rounds=1), 4)[0]
    assert "This is round 4 of 5.\nIn round 3, the average was 21 and the winning number was 14; you named 15.\n\n" in text
    assert "In round 1" not in text and "In round 2" not in text
    two = prompts(History(rounds=2), 4)
    assert "This is round 4 of 5.\nIn round 2, the average was 30.5 and the winning number was 20; you named 25.\n" \
           "In round 3, the average was 21 and the winning number was 14; you named 15.\n\n" in two[0]
    assert "In round 2, the average was 30.5 and the winning number was 20.\nIn round 3" in two[1]  # no guess stored: none said
    assert prompts(History(rounds=9), 4) == prompts(History(), 4)  # more than were played: all of them


def test_without_own_guesses_agents_of_one_persona_share_a_prompt():
    texts = prompts(History(own_guesses=False), 3, personas=PERSONAS.with_columns(education=pl.lit("Ph.D.")))
    assert texts[0] == texts[1] and "you named" not in texts[0]
    assert "In round 1, the average was 48.12 and the winning number was 32.\n" in texts[0]
    assert BEFORE.replace("; you named 35", "").replace("; you named 25", "") == prompts(History(own_guesses=False), 3)[0]


def test_no_earlier_round_still_says_which_round_it_is():
    text = prompts(History(rounds=0), 3)[0]
    assert "This is round 3 of 5.\n\nAbout you:" in text and "In round" not in text
    assert "This is round" not in prompts(History(rounds=0), 1)[0]


def test_grouped_agents_are_told_the_last_rounds_of_their_own_group():
    personas = PERSONAS.with_columns(group=pl.Series(["A", "B"]))
    groups = {"A": [dict(h, mean=h["mean"] + 10) for h in HISTORY], "B": [dict(h, mean=h["mean"] - 10) for h in HISTORY]}
    a, b = prompts(History(rounds=1, own_guesses=False), 4, personas=personas, group_history=groups)
    assert 'You play in group "A"' in a and "This is round 4 of 5.\nIn round 3, the average in your group was 31 and the winning number was 14.\n\n" in a
    assert "In round 3, the average in your group was 11 and" in b and "In round 2" not in a + b and "you named" not in a + b


def test_own_guesses_are_cut_to_the_rounds_shown():
    agents = PERSONAS.with_columns(own_guesses=pl.Series([[1.0, 2.0, 3.0], [4.0, None, 6.0]]))
    assert shown_own_guesses(agents, History()) is agents
    assert shown_own_guesses(agents, History(rounds=2))["own_guesses"].to_list() == [[2.0, 3.0], [None, 6.0]]
    assert "own_guesses" not in shown_own_guesses(agents, History(own_guesses=False)).columns
    assert "own_guesses" not in shown_own_guesses(agents, History(rounds=0)).columns
    assert shown_own_guesses(PERSONAS, History(rounds=1)) is PERSONAS  # round 1: nothing to cut


# ---------------------------------------------------------------------------- distinct prompts
SETTINGS = {"`{rounds: all}` (default)": History(), "`{rounds: 1}`": History(rounds=1), "`{own_guesses: false}`": History(own_guesses=False)}
ROUNDS = (2, 3, 4, 5)


def population(n: int, spec: str = "education.yaml") -> tuple[pl.DataFrame, np.ndarray]:
    """``n`` personas of a spec and their guesses in rounds 1–4: uniform integers from 0 to 100,
    the most varied answers a model can give (so the most distinct prompts)."""
    return sample(load_spec(spec), n, 0), np.random.default_rng(0).integers(0, 101, (n, max(ROUNDS) - 1)).astype(np.float64)


def distinct_rendered(personas: pl.DataFrame, guesses: np.ndarray, history: History, round_: int) -> int:
    """Distinct basic prompts of round ``round_``, rendered as ``tasks.play`` renders them."""
    rule = GameRule(rounds=max(ROUNDS), history=history)
    past = [{"round": r, "mean": 30.0, "winning_guess": 20.0} for r in range(1, round_)]
    agents = personas.with_columns(own_guesses=pl.Series(guesses[:, : round_ - 1].tolist(), dtype=pl.List(pl.Float64)))
    return len(set(render("basic.j2", round_variables(rule, personas, round_, past), agent_variables(shown_own_guesses(agents, history)))))


def distinct_contexts(personas: pl.DataFrame, guesses: np.ndarray, history: History, round_: int) -> int:
    """The same count without rendering: distinct (persona attributes, own guesses shown) tuples
    (everything else a prompt shows is the same for every agent of an ungrouped game)."""
    shown = history.shown(list(range(round_ - 1))) if history.own_guesses else []
    frame = personas.select(attribute_columns(personas.columns)).with_columns(
        [pl.Series(f"round {r + 1}", guesses[:, r]) for r in shown])
    return frame.n_unique() if frame.width else 1


def readme_table() -> dict[tuple[str, str], list[int]]:
    """The README's table of distinct prompts: (setting, agents) → counts in rounds 2–5."""
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## What agents are told", 1)[1].split("\n## ", 1)[0]
    rows, setting = {}, None
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 + len(ROUNDS) and re.fullmatch(r"[\d,]+|either", cells[1]):
            setting = cells[0] or setting
            rows[(setting, cells[1])] = [int(c.replace(",", "")) for c in cells[2:]]
    return rows


def test_rendering_and_counting_tuples_agree_at_1000_agents():
    personas, guesses = population(1000)
    for history in SETTINGS.values():
        assert [distinct_rendered(personas, guesses, history, r) for r in ROUNDS] == [
            distinct_contexts(personas, guesses, history, r) for r in ROUNDS]


def test_the_readme_table_of_distinct_prompts_is_what_each_setting_gives():
    table = readme_table()
    assert len(table) == 5
    for n in (1000, 1_000_000):
        personas, guesses = population(n)
        for label, history in SETTINGS.items():
            counts = [distinct_contexts(personas, guesses, history, r) for r in ROUNDS]
            expected = table.get((label, f"{n:,}")) or table[(label, "either")]
            assert counts == expected, (label, n, counts)
    # Without own guesses a round has one prompt per persona, whatever the number of agents.
    assert table[("`{own_guesses: false}`", "either")] == [5] * len(ROUNDS)


def test_the_readme_count_for_adults_whose_personas_almost_all_differ():
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## What agents are told", 1)[1]
    personas, guesses = population(1_000_000, "adults.yaml")
    fewest = distinct_contexts(personas, guesses, History(own_guesses=False), 2)
    assert f"without own guesses\na round has 1,000 and {fewest:,} prompts." in section
    assert distinct_contexts(personas[:1000], guesses[:1000], History(own_guesses=False), 2) == 1000
