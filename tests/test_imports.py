"""Importing keynes changes nothing but ``sys.modules``: no logging filter, no ``sys.excepthook``,
no environment variable. Whatever must change (``flows.failures.install``,
``cli.runtime.settings.apply``) is an explicit call.

A fresh interpreter imports every third-party module that keynes' modules import at their top
first, notes the state, imports every module of keynes, and notes it again: what a library does
as it is imported is the library's, what changes after is keynes'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_layering import LAYERS, MODULES

pytestmark = pytest.mark.quick

SCRIPT = """
import ast, importlib, json, logging, os, sys

packages, modules = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])

def third_party(path):
    for node in ast.parse(open(path).read()).body:  # the module's own top level, as importing it runs
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \\
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        yield from (n for n in names if n.split(".")[0] not in packages)

for name in sorted({n for path in modules.values() for n in third_party(path)}):
    try:
        importlib.import_module(name)
    except Exception:  # an optional extra, a GPU library: keynes' import of it fails or is lazy alike
        pass

def state():
    loggers = {"": logging.getLogger()} | {n: l for n, l in logging.Logger.manager.loggerDict.items() if isinstance(l, logging.Logger)}
    def named(f):
        return f"{type(f).__module__}.{type(f).__qualname__} {id(f)}"

    filters = {n: [named(f) for f in l.filters] for n, l in loggers.items()}
    filters |= {f"{n} handler {id(h)}": [named(f) for f in h.filters] for n, l in loggers.items() for h in l.handlers}
    return {"filters": filters, "excepthook": repr(sys.excepthook), "environ": dict(os.environ)}

before = state()
failed = {}
for name in sorted(modules):
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = repr(exc)
print(json.dumps({"before": before, "after": state(), "failed": failed}))
"""


def test_importing_every_module_of_keynes_changes_no_filter_hook_or_environment_variable():
    # As in a flow run's own process under `keynes serve`, where flows.failures.install does the most.
    env = {k: v for k, v in os.environ.items() if k != "KEYNES_VERBOSE"} | {"PREFECT__FLOW_RUN_ID": "00000000-0000-0000-0000-000000000000"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(sorted(LAYERS)), json.dumps({m: str(p) for m, p in MODULES.items()})],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    before, after = out["before"], out["after"]
    assert not {k: v for k, v in out["failed"].items() if "vllm" not in v.lower() and "cuda" not in v.lower()}, out["failed"]
    # A library may make a logger of its own later (Prefect's come with its API-key filter); a
    # logger or handler that was there must keep its filters, and no logger gets one of keynes'.
    filters = {k: after["filters"].get(k) for k, v in before["filters"].items() if after["filters"].get(k) != v}
    filters |= {k: v for k, v in after["filters"].items() for f in v if f.split(".")[0] in LAYERS}
    variables = sorted(k for k in before["environ"].keys() | after["environ"].keys() if before["environ"].get(k) != after["environ"].get(k))
    changes = [f"logging filters: {filters}"] * bool(filters) + [f"environment variables: {variables}"] * bool(variables)
    if after["excepthook"] != before["excepthook"]:
        changes.append(f"sys.excepthook: {before['excepthook']} -> {after['excepthook']}")
    assert not changes, "importing keynes changed\n" + "\n".join(changes)
