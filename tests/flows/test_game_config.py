"""Config of games, groups and custom prompts: arms are the cartesian product, errors name the field."""

from __future__ import annotations

import pytest

from design.config import ConfigError
from design.loading import load_config

pytestmark = pytest.mark.quick

BASE = {"name": "cfg", "population": {"spec": "education.yaml", "size": 10}}


def test_arms_are_engines_x_prompts_x_games_x_temperatures():
    cfg = load_config(BASE | {
        "game": {"ratio": "2/3", "rounds": 2},
        "arms": {
            "engines": [{"kind": "simulated"}, {"kind": "simulated", "rule": "cognitive_hierarchy"}],
            "prompts": ["basic", "note"],
            "games": [{}, {"ratio": "1/2"}, {"ratio": "1/2", "offset": 5}],
            "temperatures": [0.0, 1.0],
        },
    })
    arms = cfg.arms_list()
    assert len(arms) == 2 * 2 * 3 * 2
    assert len({a.run_id for a in arms}) == len(arms)
    combos = {(a.engine.model_name, a.prompt_mode, a.rule.ratio, a.rule.offset, a.temperature) for a in arms}
    assert len(combos) == len(arms)
    assert {(a.rule.ratio, a.rule.offset, a.rule.equilibrium) for a in arms} == {("2/3", 0, 0), ("1/2", 0, 0), ("1/2", 5, 10)}
    assert {a.rule.rounds for a in arms} == {2}  # fields not overridden come from `game`


def test_groups_config():
    assert load_config(BASE | {"groups": {"by": "education"}}).groups.by == "education"
    assert load_config(BASE | {"groups": {"rooms": 3}}).groups.rooms == 3


@pytest.mark.parametrize(
    "data, message",
    [
        ({"arms": {"games": [{"ratio": "2/0"}]}}, "arms.games.0.ratio: '2/0' is not a fraction"),
        ({"arms": {"games": [{}, {"ratoi": 1}]}}, "arms.games.1.ratoi: unknown key (did you mean 'ratio'?)"),
        ({"arms": {"games": [{"high": -5}]}}, "arms.games.0: high (-5) must be above low (0)"),
        ({"groups": {"by": "age"}}, "groups.by: 'age' is not a population attribute (attributes: education)"),
        ({"groups": {"rooms": 0}}, "groups.rooms: 0"),
        ({"groups": {}}, "set exactly one of `by` (an attribute) or `rooms`"),
        ({"arms": {"prompts": [{"name": "mine", "template": "/nope/mine.j2"}]}}, "template '/nope/mine.j2' not found"),
    ],
)
def test_bad_game_and_group_config_names_the_field(data, message):
    with pytest.raises(ConfigError) as err:
        load_config(BASE | data)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_custom_prompt_template(tmp_path):
    path = tmp_path / "contrarian.j2"
    path.write_text('{% include "_rules.j2" %}\nYou always go against the crowd.\nMy number is:')
    cfg = load_config(BASE | {"arms": {"prompts": ["basic", {"name": "contrarian", "template": str(path), "reasoning": False}]}})
    arms = cfg.arms_list()
    assert [a.prompt_mode for a in arms] == ["basic", "contrarian"]
    assert arms[1].mode.template == str(path) and arms[1].mode.reasoning is False


@pytest.mark.parametrize(
    "name, message",
    [
        ("paper/five", "name: 'paper/five' holds '/': a name may not hold / \\ % & < > or control characters"),
        ("a&b <v2>", "name: 'a&b <v2>' holds '&', '<', '>'"),
        ("50%", "name: '50%' holds '%'"),
        ("win\\dows", "name: 'win\\\\dows' holds '\\\\'"),
        ("two\nlines", "name: 'two\\nlines' holds '\\n'"),
        ("", "name: '': an experiment needs a name"),
        ("   ", "name: '   ': an experiment needs a name"),
        ("..", "name: '..' is no file name"),
        ("n" * 201, "name: 'nnnn"),
    ],
)
def test_a_name_that_cannot_name_a_report_file_or_a_deployment_is_refused(name, message):
    """The name makes the report's file name (``<name>-report.html``: a "/" crashed the run after
    its last round) and the Prefect deployment's (which refuses / % & < >)."""
    with pytest.raises(ConfigError) as err:
        load_config(BASE | {"name": name})
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    if len(name) > 200:
        assert "201 characters: at most 200" in str(err.value)


def test_names_with_spaces_brackets_and_accents_are_fine():
    from prefect.types.names import BANNED_CHARACTERS

    from design.config import NAME_REFUSES

    cfg = load_config(BASE | {"name": "pilot [v2] café :x: (2 of 3)"})
    assert cfg.report_path.endswith("pilot [v2] café :x: (2 of 3)-report.html")
    assert set(BANNED_CHARACTERS) <= NAME_REFUSES  # what Prefect refuses in a deployment's name is refused here first
    assert load_config(BASE | {"name": "n" * 200}).name == "n" * 200
