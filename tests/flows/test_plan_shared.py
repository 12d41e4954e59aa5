"""``keynes plan`` on the shared-context path, without a model: the distinct prompts of each round
(exact without own guesses; with them, a bound never below what uniformly drawn guesses give, and
an estimate drawn from the calibration's answers that matches the prompts those guesses give),
the trie they form, and the agents that give distinct prompts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from core.game import GameRule, History
from design.loading import load_config
from design.plan import Calibration, Counter, SharedRound, _shared_seconds, backstory_placeholder, likely_prefixes, pooled_answers, shared_round, trie_chars
from engines.llamacpp import LlamaCppSpec
from prompts.context import agent_variables
from prompts.render import distinct_agents, render
from tests.prompts.test_history_setting import ROUNDS, SETTINGS, distinct_contexts, population, readme_table

pytestmark = pytest.mark.quick


def arm_of(history: History, n: int = 1000):
    cfg = load_config({"name": "p", "population": {"spec": "education.yaml", "size": n},
                       "game": {"rounds": 5, "history": history.model_dump()},
                       "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic"]}})
    (arm,) = cfg.arms_list()
    return arm


def test_the_trie_holds_each_distinct_text_past_the_prefix_it_shares_with_the_one_before():
    assert trie_chars([]) == 0
    assert trie_chars(["abd", "ab", "abc", "abd"]) == 2 + 1 + 1  # ab, then c, then d
    assert trie_chars(["b", "a"]) == 2


def test_own_guesses_shown_follow_the_history_setting():
    def shown(history: History) -> list[int]:
        return [GameRule(rounds=5, history=history).history.own_guesses_in(r) for r in range(1, 6)]

    assert shown(History()) == [0, 1, 2, 3, 4]
    assert shown(History(rounds=1)) == [0, 1, 1, 1, 1]
    assert shown(History(rounds=2)) == [0, 1, 2, 2, 2]
    assert shown(History(own_guesses=False)) == [0] * 5
    assert shown(History(rounds=0)) == [0] * 5


def test_distinct_agents_are_the_first_of_each_prompt():
    personas, _ = population(1000)
    variables = agent_variables(personas)
    groups = distinct_agents("basic.j2", variables)
    rows = groups["row"].to_list()
    prompts = render("basic.j2", {"game": {"n_players": "1,000", "low": "0", "high": "100", "integer": True, "describe": "2/3 of the average",
                                          "rounds": 1}, "round": 1, "history": []}, variables)
    assert len(rows) == len(set(prompts)) == 5
    assert [prompts.index(prompts[r]) for r in rows] == rows  # each the first agent with its prompt
    assert groups["agents"].to_list() == [prompts.count(prompts[r]) for r in rows]  # and how many share it
    # a template that uses no agent variable: one prompt, the first agent's, everyone's
    assert distinct_agents("basic.j2", pl.DataFrame({"_": [None] * 3})).rows() == [(0, 3)]


@pytest.mark.parametrize("n", [1000, 1_000_000])
def test_the_prompts_planned_are_never_fewer_than_uniform_guesses_give(n):
    """The README's table counts the distinct prompts of uniformly drawn guesses (the most varied
    answers): the plan's count is that exactly without own guesses, and a bound with them that a
    million agents reach in rounds 2 and 3 (5 personas × 101 first guesses, × 101 second ones)."""
    table = readme_table()
    personas, guesses = population(n)
    counter = Counter(arm_of(History()).engine)
    for label, history in SETTINGS.items():
        arm = arm_of(history, n)
        planned = [shared_round(arm, r, personas, counter, 1.0, 0.0) for r in (1, *ROUNDS)]
        assert planned[0].prompts == 5 and not planned[0].at_most
        counted = table.get((label, f"{n:,}")) or table[(label, "either")]
        assert counted == [distinct_contexts(personas, guesses, history, r) for r in ROUNDS]
        if history.own_guesses:
            assert all(p.at_most and p.prompts >= c for p, c in zip(planned[1:], counted)), (label, planned, counted)
        else:
            assert [p.prompts for p in planned[1:]] == counted and not any(p.at_most for p in planned)
        if n == 1_000_000 and history == History():
            assert [p.prompts for p in planned[1:3]] == counted[:2] == [505, 51_005]
        # Every round's prompts cost tokens; told their own guesses, agents' prompts cost more.
        assert all(p.tokens > 0 for p in planned)
    with_own = [shared_round(arm_of(History(), n), r, personas, counter, 1.0, 0.0) for r in ROUNDS]
    without = [shared_round(arm_of(History(own_guesses=False), n), r, personas, counter, 1.0, 0.0) for r in ROUNDS]
    assert all(w.tokens > o.tokens for w, o in zip(with_own, without)), (with_own, without)


def test_with_backstories_every_agent_has_a_prompt_of_its_own():
    """Backstories are written per agent at run time: the plan's stand-in keeps them apart."""
    cfg = load_config({"name": "p", "population": {"spec": "education.yaml", "size": 300, "backstories": {"enabled": True}},
                       "game": {"rounds": 2}, "arms": {"engines": [{"kind": "simulated"}], "prompts": ["background"]}})
    (arm,) = cfg.arms_list()
    personas = backstory_placeholder(population(300)[0], 40)
    assert personas["background"].str.split(" ").list.len().to_list() == [40] * 300
    rounds = [shared_round(arm, r, personas, Counter(arm.engine), 1.0, 0.0) for r in (1, 2)]
    assert [r.prompts for r in rounds] == [300, 300], rounds


def test_shared_time_is_tokens_at_the_calibrated_rate_plus_every_agents_own_part_over_the_actors():
    cfg = load_config({"name": "p", "population": {"size": 1_000_000}, "arms": {"engines": [{"kind": "simulated"}]},
                       "workers": {"actors": 2, "shard_size": 50_000}})
    cal = Calibration(agents=3, seconds_per_agent=0.2, completion_tokens=2, prompt_tokens=60, counted_prompt=60,
                      seconds=0.3, distinct=3, tokens_evaluated=300, trie_tokens=150, bookkeeping=4e-6)
    assert cal.node_tokens == 50  # what the calibration evaluated beyond its prompts' trie, a prompt
    work = [SharedRound(5, 500), SharedRound(505, 20_000, at_most=505)]
    # 20,500 tokens at 1 ms each, and 2 rounds of a million agents at 4 µs each, on 2 actors
    assert _shared_seconds(cfg, 1_000_000, work, cal) == pytest.approx((20.5 + 8.0) / 2)
    # an engine that does not count its tokens: its prompts at the calibration's 0.1 s each
    uncounted = Calibration(3, 0.2, 2, 60, 60, seconds=0.3, distinct=3, tokens_evaluated=None, bookkeeping=4e-6)
    assert _shared_seconds(cfg, 1_000_000, work, uncounted) == pytest.approx((510 * 0.1 + 8.0) / 2)


def test_a_persona_of_few_agents_has_no_more_prompts_than_agents():
    """The bound is per persona: 990 agents of one persona and 10 of another have at most 101 + 10
    prompts in round 2, not 2 × 101."""
    personas, _ = population(1000)
    education = ["High School"] * 990 + ["Doctorate"] * 10
    personas = personas.with_columns(education=pl.Series(education, dtype=personas.schema["education"]))
    arm = arm_of(History(), 1000)
    counter = Counter(arm.engine)
    assert [shared_round(arm, r, personas, counter, 1.0, 0.0).prompts for r in (1, 2, 3)] == [2, 101 + 10, 990 + 10]


UNIFORM = np.full(101, 1 / 101)


def test_likely_prefixes_are_one_seeded_draw_of_every_agents_guesses():
    sizes = np.array([200, 300, 500])
    # every agent names the same number: one history a persona, however long
    assert likely_prefixes(sizes, np.array([1.0]), 4, 0).tolist() == [3, 3, 3, 3]
    # a hundred thousand agents a persona draw every one of 101 numbers
    assert likely_prefixes(np.array([100_000, 100_000]), UNIFORM, 1, 0).tolist() == [202]
    # longer histories: never fewer, never more than agents or histories; the same first guesses for every k
    counts = likely_prefixes(sizes, UNIFORM, 4, 7)
    assert counts.tolist() == sorted(counts) and counts[0] < 3 * 101 and counts[-1] <= sizes.sum(), counts
    assert likely_prefixes(sizes, UNIFORM, 2, 7).tolist() == counts[:2].tolist()
    # one guess: the expected number of distinct values, Σ 1 - (1 - p)^n over values and personas
    skewed = np.arange(1, 102, dtype=float) ** 3
    skewed /= skewed.sum()
    expected = sum((1 - (1 - skewed) ** n).sum() for n in sizes)
    assert likely_prefixes(sizes, skewed, 1, 3)[0] == pytest.approx(expected, rel=0.05)
    assert likely_prefixes(sizes, skewed, 3, 5).tolist() == likely_prefixes(sizes, skewed, 3, 5).tolist()  # seeded


def test_the_trie_of_later_rounds_grows_with_the_histories_agents_share():
    """Agents who named the same first guesses share their prompt up to the next one: the same
    prompts cost fewer tokens when answers repeat. One answer for everyone: one prompt a persona,
    the trie of the personas' prompts and nothing more; and a shared path that evaluates in blocks
    adds half a block for each further prompt (where it leaves the one before it)."""
    personas, _ = population(1000)
    arm = arm_of(History())
    counter = Counter(arm.engine)
    same = [shared_round(arm, r, personas, counter, 1.0, 12.0, np.array([1.0]), 1) for r in ROUNDS]
    assert [s.prompts for s in same] == [5] * 4 and [s.at_most for s in same] == [505, 1000, 1000, 1000]
    without = [shared_round(arm_of(History(own_guesses=False)), r, personas, counter, 1.0, 12.0) for r in ROUNDS]
    assert [s.tokens for s in same] == pytest.approx([w.tokens for w in without], rel=0.1)  # one prompt a persona either way
    skewed = np.arange(1, 102, dtype=float) ** 8  # a few numbers named by most agents
    skewed /= skewed.sum()
    few, many = ([shared_round(arm, r, personas, counter, 1.0, 12.0, p, 1) for r in ROUNDS] for p in (skewed, UNIFORM))
    assert all(f.prompts < m.prompts and f.tokens / f.prompts < m.tokens / m.prompts for f, m in zip(few[1:], many[1:])), (few, many)
    blocks = [shared_round(replace(arm, engine=LlamaCppSpec()), r, personas, counter, 1.0, 12.0, UNIFORM, 1) for r in ROUNDS]
    assert LlamaCppSpec().prefix_block == 16 and arm.engine.prefix_block == 1
    assert [b.tokens - m.tokens for b, m in zip(blocks, many)] == pytest.approx([(m.prompts - 5) * 7.5 for m in many])


def test_pooled_answers_weigh_each_context_by_its_agents():
    rows = pl.DataFrame({"context": ["a", "a", "b", "b"], "answer": ["10", "20", "20", "30"], "probability": [0.5, 0.5, 0.25, 0.75],
                         "agents": [1, 1, 3, 3]})
    # "10": 0.5 × 1 agent; "20": 0.5 × 1 + 0.25 × 3; "30": 0.75 × 3; of 4 agents
    assert pooled_answers(rows) == pytest.approx([0.5 / 4, 1.25 / 4, 2.25 / 4])
    # in the answers' order whatever the rows' (the plan's draws from them are seeded)
    assert pooled_answers(rows.reverse()).tolist() == pooled_answers(rows).tolist()


@pytest.mark.parametrize("n", [1000, 1_000_000])
def test_drawn_from_uniform_answers_the_estimate_is_the_readmes_count(n):
    """The README's table renders the prompts of uniformly drawn guesses and counts them; the plan,
    told the answers are uniform, draws histories instead of rendering prompts: the same counts
    within 5 %, within the bound, and below it where a persona's agents repeat histories."""
    table = readme_table()
    personas, guesses = population(n)
    counter = Counter(arm_of(History()).engine)
    for label, history in SETTINGS.items():
        if not history.own_guesses:
            continue
        arm = arm_of(history, n)
        planned = [shared_round(arm, r, personas, counter, 1.0, 0.0, UNIFORM, 11) for r in ROUNDS]
        counted = table.get((label, f"{n:,}")) or table[(label, "either")]
        assert [p.prompts for p in planned] == pytest.approx(counted, rel=0.05), (label, planned, counted)
        assert all(p.prompts <= p.at_most for p in planned)
        bound = shared_round(arm, 2, personas, counter, 1.0, 0.0)
        if n == 1000:  # ~200 agents a persona repeat some of 101 first guesses: fewer prompts, fewer tokens
            assert planned[0].prompts < bound.prompts and planned[0].tokens < bound.tokens
        else:  # a million agents draw every first guess of every persona: the bound itself
            assert planned[0].prompts == bound.prompts == 505 and planned[0].tokens == bound.tokens


def test_a_long_game_is_bounded_by_its_agents():
    """101^14 possible histories in round 15 are far beyond any integer type: the bound is the agents."""
    cfg = load_config({"name": "p", "population": {"spec": "education.yaml", "size": 1000}, "game": {"rounds": 15},
                       "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic"]}})
    (arm,) = cfg.arms_list()
    personas, _ = population(1000)
    last = shared_round(arm, 15, personas, Counter(arm.engine), 1.0, 0.0, UNIFORM, 1)
    assert last.at_most == 1000 and 990 <= last.prompts <= 1000, last
