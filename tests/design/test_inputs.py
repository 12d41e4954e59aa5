"""An experiment's identity covers its inputs: an edited template (or a file it includes), a
replaced model file or folder, another chat template is refused on a rerun, in one line naming it,
before anything runs; an untouched rerun goes on; warehouses from before keep their ids."""

from __future__ import annotations

import json
import string

import duckdb
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from design.inputs import InputsChanged, arm_inputs, check_inputs, fingerprint
from design.loading import load_config
from engines import spec_class
from tests.conftest import QUICKSTART
from tests.support.cli import invoke
from tests.support.sql import q
from warehouse.provenance import record_inputs, recorded_inputs
from warehouse.schema import MIGRATIONS, SCHEMA_VERSION
from warehouse.store import Warehouse

pytestmark = pytest.mark.quick


def write_experiment(folder, engine=None):
    """A config whose own template includes a file beside it (``_rules.j2``, which shadows
    keynes's) and keynes's ``_persona.j2``: (config file, template, include)."""
    template, include = folder / "mine.j2", folder / "_rules.j2"
    include.write_text("Everyone names a number from 0 to 100.")
    template.write_text('{% include "_rules.j2" %}\n{%- include "_persona.j2" %}\nMy number is:')
    config = {
        "name": "inputs", "population": {"spec": "education.yaml", "size": 5},
        "arms": {"engines": [engine or {"kind": "simulated"}], "prompts": [{"name": "mine", "template": str(template), "reasoning": False}]},
        "report": {"enabled": False},
    }
    path = folder / "inputs.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, template, include


def recorded_warehouse(config_path, db):
    """A warehouse that holds the experiment as its first run recorded it (no rounds played)."""
    cfg = load_config(config_path, [f"db={db}"])
    warehouse = Warehouse(db)
    warehouse.begin_experiment(cfg.experiment_id, cfg.name, cfg.model_dump(mode="json"), cfg.config_hash, cfg.seed, 5)
    record_inputs(warehouse, cfg.experiment_id, fingerprint(cfg))
    return cfg


@pytest.mark.parametrize("edit", ["template", "include"])
@pytest.mark.parametrize("change", ["appended", "replaced", "emptied"])
def test_a_rerun_after_an_edit_is_refused_in_one_line_with_exit_2_writing_nothing(tmp_path, edit, change):
    config_path, template, include = write_experiment(tmp_path)
    db = tmp_path / "keynes.duckdb"
    cfg = recorded_warehouse(config_path, db)
    before = q(db, "select experiment_id, status, inputs from experiments")
    edited = template if edit == "template" else include
    text = edited.read_text()
    edited.write_text({"appended": text + " ", "replaced": text.replace("number", "integer"),
                       "emptied": '{% include "_rules.j2" %}' if edit == "template" else ""}[change])
    result, lines = invoke("run", str(config_path), "--db", str(db))
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and f"{edited} changed since experiment {cfg.experiment_id} was first run" in lines[0], lines
    assert "--set name=NEW_NAME" in lines[0] and f"restore {edited}" in lines[0]
    assert q(db, "select experiment_id, status, inputs from experiments") == before
    assert q(db, "select (select count(*) from runs), (select count(*) from provenance), (select count(*) from guesses)") == [(0, 0, 0)]
    edited.write_text(text)  # restored: the same inputs again
    assert check_inputs(cfg.experiment_id, recorded_inputs(Warehouse(db), cfg.experiment_id), fingerprint(cfg)) == json.loads(before[0][2])


def test_a_replaced_model_folder_is_named(tmp_path):
    folder = tmp_path / "tiny-hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["Gemma3ForCausalLM"]}')
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    config_path, _, _ = write_experiment(tmp_path, {"kind": "vllm", "model": str(folder), "prompt_format": "completion"})
    cfg = load_config(config_path, [])
    first = fingerprint(cfg)
    assert first[f"model {folder}"].startswith("folder:")
    (folder / "model.safetensors").write_bytes(b"\0" * 65)  # other weights of another size
    with pytest.raises(InputsChanged, match=f"^model {folder} changed since experiment {cfg.experiment_id} was first run"):
        check_inputs(cfg.experiment_id, first, fingerprint(cfg))
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (folder / "config.json").write_text('{"architectures": ["Gemma3ForCausalLM"], "rope_theta": 1}')
    with pytest.raises(InputsChanged, match=f"^model {folder} changed"):
        check_inputs(cfg.experiment_id, first, fingerprint(cfg))


def test_a_replaced_gguf_is_named_and_hashed_once_per_size_and_mtime(tmp_path, monkeypatch):
    import engines.identity as identity

    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path / "cache"))
    hashed = []
    real = identity.sha256_file
    monkeypatch.setattr(identity, "sha256_file", lambda path: hashed.append(path) or real(path))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"\1" * 100)
    spec = spec_class("llamacpp")(model=str(model))
    first = spec.identity()
    assert spec.identity() == first and len(hashed) == 1  # the cache answers: not hashed again
    model.write_bytes(b"GGUF" + b"\2" * 100)  # another quantization under the same name
    with pytest.raises(InputsChanged, match=f"^model {model} changed since experiment e-1 was first run"):
        check_inputs("e-1", first, spec.identity())
    assert len(hashed) == 2


@pytest.mark.llm
def test_the_bundled_gguf_hashes_to_its_recorded_sha256(tmp_path, monkeypatch):
    from engines.identity import file_sha256
    from engines.models import MODELS, gguf_path

    path = gguf_path("gemma-3-270m")
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path))  # the digest cache only: the model stays where it is
    assert file_sha256(path) == MODELS["gemma-3-270m"].sha256
    assert spec_class("llamacpp")().identity() == {"model gemma-3-270m": f"sha256:{MODELS['gemma-3-270m'].sha256}"}


def test_an_arm_covers_its_template_includes_model_and_chat_template():
    cfg = load_config(QUICKSTART, ["arms.engines=[{kind: llamacpp, model: smollm2-135m-instruct}]"])
    inputs = arm_inputs(cfg.arms_list()[1])
    assert {"template prompts/cot.j2", "template prompts/_rules.j2", "template prompts/_persona.j2", "template prompts/_think.j2",
            "model smollm2-135m-instruct", "chat template of model smollm2-135m-instruct"} == set(inputs)


names = st.builds("{} {}".format, st.sampled_from(["template", "model", "chat template of model"]),
                  st.text(string.ascii_lowercase + "/._-", min_size=1, max_size=12))
digests = st.text("0123456789abcdef", min_size=4, max_size=8)


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(names, digests, min_size=1), st.data())
def test_only_inputs_recorded_on_both_sides_are_compared(recorded, data):
    changed = data.draw(st.sets(st.sampled_from(sorted(recorded))))
    added = data.draw(st.dictionaries(names.filter(lambda n: n not in recorded), digests))
    current = {n: ("x" + d if n in changed else d) for n, d in recorded.items() if n in changed or data.draw(st.booleans())} | added
    if changed:
        with pytest.raises(InputsChanged) as refused:
            check_inputs("e-1", recorded, current)
        first = min(changed)
        said = first.removeprefix("template ") if not first.startswith("chat") else f"the {first}"
        assert str(refused.value).startswith(f"{said} changed since experiment e-1 was first run")
        assert "\n" not in str(refused.value)
    else:  # kept as recorded, and names recorded now for the first time are added
        assert check_inputs("e-1", recorded, current) == {**added, **recorded}


def test_a_hub_model_recorded_before_its_download_matches_its_revision():
    before, after = {"model org/m": "hf:org/m@main"}, {"model org/m": "hf:org/m@0123abc"}
    assert check_inputs("e-1", before, after) == after  # resolved since: recorded so
    with pytest.raises(InputsChanged, match="^model org/m changed"):
        check_inputs("e-1", after, {"model org/m": "hf:org/m@4567def"})


def test_a_warehouse_from_before_opens_keeps_its_ids_and_gets_its_inputs(tmp_path):
    db = tmp_path / "old.duckdb"
    cfg = load_config(QUICKSTART, [])
    assert cfg.experiment_id == "quickstart-f0ab3529"  # as keynes computed it before inputs were recorded
    with duckdb.connect(str(db)) as con:  # schema 8 and an experiment row without inputs, as a schema-8 warehouse holds them
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for version, migration in enumerate(MIGRATIONS[:8], start=1):
            con.execute(migration)
            con.execute("INSERT INTO schema_version VALUES (?)", [version])
        con.execute("INSERT INTO experiments (experiment_id, name, config, config_hash, seed, population, status) "
                    "VALUES (?, ?, ?, ?, ?, ?, 'completed')",
                    [cfg.experiment_id, cfg.name, json.dumps(cfg.model_dump(mode="json")), cfg.config_hash, cfg.seed, 30])
    warehouse = Warehouse(db)
    assert recorded_inputs(warehouse, cfg.experiment_id) is None
    assert q(db, "select max(version) from schema_version") == [(SCHEMA_VERSION,)]
    result, _ = invoke("show", "--db", str(db), "quickstart")
    assert result.exit_code == 0 and "inputs: not recorded yet" in result.stdout and "provenance: none recorded" in result.stdout
    inputs = check_inputs(cfg.experiment_id, None, fingerprint(cfg))  # accepted
    record_inputs(warehouse, cfg.experiment_id, inputs)
    assert q(db, "select experiment_id, config_hash from experiments") == [(cfg.experiment_id, cfg.config_hash)]
    assert recorded_inputs(warehouse, cfg.experiment_id) == fingerprint(cfg)


def test_a_served_model_recorded_without_its_servers_report_gets_it_and_a_changed_report_is_refused():
    bare = "served:http://h:8080/v1 m"
    gemma, smollm = f"{bare} server:sha256:aa", f"{bare} server:sha256:bb"
    assert check_inputs("e-1", {"model m": bare}, {"model m": gemma}) == {"model m": gemma}  # recorded before reports were
    assert check_inputs("e-1", {"model m": gemma}, {"model m": bare}) == {"model m": gemma}  # the server did not answer
    with pytest.raises(InputsChanged, match="^model m changed since experiment e-1 was first run"):
        check_inputs("e-1", {"model m": gemma}, {"model m": smollm})
    with pytest.raises(InputsChanged, match="^model m changed"):
        check_inputs("e-1", {"model m": bare}, {"model m": "served:http://other:8080/v1 m server:sha256:aa"})
