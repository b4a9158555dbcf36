"""The parent never imports torch or a model library; the rooms of orchestrator/ and stages/ keep their arrows one
way (one table each, and a tree with a forbidden import shows each table failing)."""

from __future__ import annotations

import ast
import graphlib
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
    for room in ("run", "planning", "models", "corpus", "books"):
        assert _offenders("orchestrator/process", f"orchestrator.{room}") == []


def test_the_run_uses_the_products_only_where_it_finishes_an_input():
    assert (
        _offenders(
            "orchestrator/run",
            "orchestrator.corpus",
            lambda path, _: path in ("orchestrator/run/finish.py", "orchestrator/run/pipeline.py"),
        )
        == []
    )


#: orchestrator's rooms (a subpackage folder, or a top-level module; ``__init__`` is the package's face,
#: ``orchestrator/__init__.py``) and the rooms each may import. A room not in the table may import none.
#: run: the run (chunks, runner, retries, finishing, report, progress, enroll); planning: what a run will do;
#: models: which model each stage runs and the model cache; books: the output folder's journal, lock and
#: corpus speakers;
#: corpus: the output folder's products; process: the children; the rest: one module each.
ROOM_ARROWS: dict[str, set[str]] = {
    "__init__": {"run", "settings"},
    "api": {"books", "catalogue", "corpus", "gpu", "models", "planning", "process", "run", "settings"},
    "books": {"layout"},
    "catalogue": {"books", "corpus", "layout", "models", "process", "remote", "settings"},
    "corpus": {"books", "layout", "models", "planning"},
    "gpu": {"settings"},
    "layout": set(),
    "models": {"gpu", "registry", "settings"},
    "planning": {"books", "layout", "models", "registry", "remote", "settings"},
    "process": {"gpu", "registry", "settings", "telemetry"},
    "registry": {"gpu", "settings"},
    "remote": {"process"},
    "run": {
        "books",
        "catalogue",
        "corpus",
        "gpu",
        "layout",
        "models",
        "planning",
        "process",
        "registry",
        "remote",
        "scale",
        "settings",
        "telemetry",
    },
    "scale": {"process", "settings"},
    "settings": {"layout"},
    "settings_doc": {"settings"},
    "telemetry": {"layout"},
}
#: the command line stands above every other room (a module, or a package once split)
ROOM_ARROWS["cli"] = set(ROOM_ARROWS)


def _room(root, package: str, dotted: str) -> str | None:
    """The room of ``package`` that ``dotted`` (a module, or a name in one) is in under ``root``; a name of
    the package itself (``from orchestrator import Settings``) is its face, ``__init__``."""
    parts = dotted.split(".")
    if parts[0] != package:
        return None
    if len(parts) > 1 and (
        (root / package / parts[1]).is_dir() or (root / package / f"{parts[1]}.py").is_file()
    ):
        return parts[1]
    return "__init__"


def _written(path, root):
    """Each import of ``path`` (also inside functions) as the dotted name it names: ``import a.b`` -> a.b,
    ``from a.b import c`` -> a.b, ``from a import b`` -> a.b (``b`` may be a module); relative ones
    resolved against ``path``'s package under ``root``."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            if "." in base:
                yield base
            else:
                yield from (f"{base}.{alias.name}" for alias in node.names)


def room_arrows(root, package: str = "orchestrator") -> list[tuple[str, str, str, str]]:
    """(room, room it imports, file, what it imports) for each import of one of ``package``'s rooms from
    another, in every file under ``root/package``."""
    arrows = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root / package)
        room = rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 else rel.stem
        for name in _written(path, root):
            target = _room(root, package, name)
            if target is not None and target != room:
                arrows.append((room, target, path.relative_to(root).as_posix(), name))
    return arrows


def room_offenders(root, rules: dict[str, set[str]], package: str = "orchestrator") -> list[str]:
    """``file: module`` for each import from one room of ``package`` into another that ``rules`` (room ->
    the rooms it may import) does not allow."""
    return sorted(
        f"{file}: {name}"
        for room, target, file, name in room_arrows(root, package)
        if target not in rules.get(room, ())
    )


def test_each_room_imports_only_the_rooms_the_table_allows():
    # corpus/ uses no run/ (enroll is the run's); process/ never the run, planning, models, products or books
    assert room_offenders(ROOT, ROOM_ARROWS) == []


def test_a_forbidden_arrow_is_reported_with_its_file_and_module(tmp_path):
    # Given a tiny tree where planning/x.py imports the run's chunk loop (inside a function) and run/ may
    # import planning/
    files = {
        "orchestrator/__init__.py": "",
        "orchestrator/layout.py": "",
        "orchestrator/planning/__init__.py": "",
        "orchestrator/planning/x.py": (
            "from orchestrator import layout\n\n\ndef f():\n    import orchestrator.run.chunk\n"
        ),
        "orchestrator/run/__init__.py": "",
        "orchestrator/run/chunk.py": "from orchestrator.planning.x import f\nfrom . import pipeline\n",
        "orchestrator/run/pipeline.py": "from ..planning import x\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    rules = {"planning": {"layout"}, "run": {"planning"}, "layout": set()}
    # Then that import, and only it, is reported
    assert room_offenders(tmp_path, rules) == ["orchestrator/planning/x.py: orchestrator.run.chunk"]
    # and allowed, nothing is
    assert room_offenders(tmp_path, rules | {"planning": {"layout", "run"}}) == []


#: stages' rooms: the stage modules at the top (one module each), the engines they run (``whisper``,
#: ``voices``), what every child shares (``runtime``), and the HTTP API's long-lived children (``workers``).
#: A stage imports the engines and the runtime and no other stage (``voice_profile`` decodes its clips with
#: the ``audio`` stage's decoder); an engine imports only the runtime; the runtime imports nothing above it.
STAGE_MODULES = ("audio", "asr", "diarization", "enrollment", "alignment", "embeddings", "voice_profile")
STAGE_ROOM_ARROWS: dict[str, set[str]] = {
    "__init__": set(),
    "runtime": set(),
    "whisper": {"runtime"},
    "voices": {"runtime"},
    **{stage: {"runtime", "whisper", "voices"} for stage in STAGE_MODULES},
    "voice_profile": {"runtime", "voices", "audio"},
    "workers": {"runtime", "embeddings"},
}


def test_each_room_of_the_stages_imports_only_the_rooms_the_table_allows():
    assert room_offenders(ROOT, STAGE_ROOM_ARROWS, package="stages") == []
    # every file of stages/ is in a room of the table (a new room is placed in it)
    rooms = {room for room, _, _, _ in room_arrows(ROOT, "stages")}
    assert rooms <= set(STAGE_ROOM_ARROWS)


def test_an_engine_importing_a_stage_is_reported(tmp_path):
    # Given a tree where the Whisper engine reaches up into the asr stage (the arrow the rooms forbid)
    files = {
        "stages/__init__.py": "",
        "stages/asr.py": "from stages.whisper.models import resolve_model\n",
        "stages/whisper/__init__.py": "",
        "stages/whisper/models.py": "def resolve_model():\n    from stages.asr import STAGE\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    # Then that import, and only it, is reported
    assert room_offenders(tmp_path, STAGE_ROOM_ARROWS, package="stages") == [
        "stages/whisper/models.py: stages.asr"
    ]


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return exc.args[1]
    return None


def test_no_circle_between_rooms():
    # neither in the table nor in the tree (whose arrows the table holds, but also a room it does not name)
    assert _circle(ROOM_ARROWS) is None
    assert _circle(STAGE_ROOM_ARROWS) is None
    for package in ("orchestrator", "stages"):
        real: dict[str, set[str]] = {}
        for room, target, _, _ in room_arrows(ROOT, package):
            real.setdefault(room, set()).add(target)
        assert _circle(real) is None, package


def test_no_circle_between_files():
    # every import of one of orchestrator's modules by another, also inside functions
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (ROOT / "orchestrator").rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        for name in _written(path, ROOT):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                graph.setdefault(module, set()).add(name)
    assert _circle(graph) is None


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
