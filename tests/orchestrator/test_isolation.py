"""The parent never imports torch or a model library; the layout keeps its arrows one way."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from tests.conftest import ROOT

HEAVY = (
    "torch",
    "whisperx",
    "speechbrain",
    "sentence_transformers",
    "pyannote",
    "faster_whisper",
    "ctranslate2",
    "transformers",
    "torchaudio",
    "av",
)


def _imports(package: str) -> set[str]:
    """Top-level names of every module imported anywhere in ``package`` (also inside functions)."""
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_contracts_import_nothing_of_ours_and_no_model_library():
    found = _imports("contracts")
    assert not found & {"orchestrator", "stages"}
    assert not found & set(HEAVY)


def test_stages_never_import_orchestrator():
    assert "orchestrator" not in _imports("stages")


def test_orchestrator_has_no_model_library_imports_even_inside_functions():
    assert not _imports("orchestrator") & set(HEAVY)


def test_importing_every_parent_module_loads_no_heavy_module():
    code = (
        "import importlib, json, pkgutil, sys, orchestrator, contracts\n"
        "for pkg in (orchestrator, contracts):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        f"print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in {HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def _imported_modules(path) -> set[str]:
    """Full names of what ``path`` imports anywhere (also inside functions); ``from a import b`` counts as
    ``a.b`` (``b`` may be a module or a name in ``a``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _offenders(folder: str, forbidden: str, allowed=lambda path, name: False) -> list[str]:
    """``path: module`` for each import of ``forbidden`` (or below it) in ``folder`` not ``allowed``."""
    return sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / folder).rglob("*.py")
        for name in _imported_modules(path)
        if _under(name, forbidden) and not allowed(path.relative_to(ROOT).as_posix(), name)
    )


def test_the_process_layer_knows_nothing_of_runs_or_their_products():
    # what happened to a child (process/) is told upwards; the run decides what follows
    assert _offenders("orchestrator/process", "orchestrator.run") == []
    assert _offenders("orchestrator/process", "orchestrator.corpus") == []


def test_the_run_uses_the_products_only_where_it_finishes_an_input():
    assert (
        _offenders(
            "orchestrator/run",
            "orchestrator.corpus",
            lambda path, _: path in ("orchestrator/run/finish.py", "orchestrator/run/pipeline.py"),
        )
        == []
    )


#: what the products of an output folder use of the run's machinery: the output lock, the plan's ids and
#: the journal (export, speakers); enroll runs its one child through the hub check and the stage runner
CORPUS_USES_OF_RUN = {
    "orchestrator/corpus/enroll.py": {"orchestrator.models.hub", "orchestrator.run.runner"},
    "*": {"orchestrator.books.lock", "orchestrator.planning.inputs", "orchestrator.books.journal"},
}


def _corpus_may_use(path: str, name: str) -> bool:
    allowed = CORPUS_USES_OF_RUN.get(path, set()) | CORPUS_USES_OF_RUN["*"]
    # `from orchestrator.books.lock import OutputLock` also names orchestrator.books.lock.OutputLock
    return any(name == module or name.startswith(module + ".") for module in allowed)


def test_the_products_use_only_the_runs_lock_plan_journal_and_for_enroll_its_runner():
    assert _offenders("orchestrator/corpus", "orchestrator.run", _corpus_may_use) == []


def test_no_module_imports_a_private_name_of_another_module():
    # Given every Python file of the project (tests and benchmarks included)
    offenders = []
    for package in ("orchestrator", "stages", "contracts", "bench", "tests"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                # Then no `from x import _name` and no `import x._private`
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
                    offenders += [
                        f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_")
                    ]
                    if node.module and any(part.startswith("_") for part in node.module.split(".")):
                        offenders.append(f"{path.relative_to(ROOT)}: {node.module}")
                elif isinstance(node, ast.Import):
                    offenders += [
                        f"{path.relative_to(ROOT)}: {a.name}"
                        for a in node.names
                        if any(part.startswith("_") for part in a.name.split("."))
                    ]
    assert offenders == []
