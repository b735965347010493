"""No module imports from a layer above its own (the order is in docs/ARCHITECTURE.md).

Every ``import`` in ``slotune/`` counts, at module level or inside a function (a lazy
import is still a dependency), relative imports resolved, ``TYPE_CHECKING`` ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "slotune"

# Lowest first. A module may import from its own layer and the layers before it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("slotune._extras", "slotune._version", "slotune.outputs")),
    ("engine", ("slotune.engine",)),
    ("targets", ("slotune.targets",)),
    ("workloads", ("slotune.workloads",)),
    ("server", ("slotune.server",)),
    ("validate", ("slotune.validate",)),
    ("calibration", ("slotune.calibration",)),
    ("regress", ("slotune.regress",)),
    ("tuner", ("slotune.tuner",)),
    ("cluster", ("slotune.cluster",)),
    ("reports", ("slotune.reports",)),
    ("api", ("slotune.api",)),
    ("cli", ("slotune.cli", "slotune.__main__")),
    ("package", ("slotune",)),  # slotune/__init__.py: the public names, imported lazily
)


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of ``module``: its longest matching prefix."""
    best, length = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix == "slotune"  # the package itself, not everything under it
            hit = module == prefix or (not exact and module.startswith(prefix + "."))
            if hit and len(prefix) > length:
                best, length = index, len(prefix)
    if best < 0:
        raise KeyError(f"{module} is in no layer: add it to LAYERS and docs/ARCHITECTURE.md")
    return best


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every slotune import in the file, wherever it is."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from slotune import tuner`` imports the module slotune.tuner
            found += [(node.lineno, target)]
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return [(line, m) for line, m in found if m == "slotune" or m.startswith("slotune.")]


def violations(root: Path) -> list[str]:
    """One line per import statement that reaches above its module's layer."""
    out = []
    for path in sorted(root.rglob("*.py")):
        here = module_name(path, root)
        mine = layer_of(here)
        worst: dict[int, str] = {}  # line -> the highest module it imports
        for line, target in imports(path, root):
            if _is_module(target, root) and layer_of(target) >= layer_of(worst.get(line, here)):
                worst[line] = target
        for line, target in sorted(worst.items()):
            theirs = layer_of(target)
            if theirs > mine:
                out.append(
                    f"{path.relative_to(root.parent)}:{line}: {here} ({LAYERS[mine][0]}) "
                    f"imports {target} ({LAYERS[theirs][0]})"
                )
    return out


def _is_module(name: str, root: Path) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    base = root / rel
    return name == "slotune" or base.with_suffix(".py").is_file() or base.is_dir()


def test_no_module_imports_from_a_higher_layer() -> None:
    found = violations(ROOT)
    assert not found, "imports up the layers:\n" + "\n".join(found)


def test_every_module_has_a_layer() -> None:
    for path in ROOT.rglob("*.py"):
        layer_of(module_name(path, ROOT))


def test_the_engine_knows_nothing_above_it() -> None:
    engine = layer_of("slotune.engine.scheduler")
    for above in ("workloads", "tuner", "reports", "cli", "regress", "validate", "calibration"):
        assert layer_of(f"slotune.{above}") > engine
    assert layer_of("slotune.server.app") > engine


def test_the_engine_has_no_http_code() -> None:
    """The OpenAI server lives beside the engine (``slotune/server/``), not inside it."""
    for path in (ROOT / "engine").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "aiohttp" for n in names), path


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "slotune"
    for name, text in files.items():
        file = root / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()
    return root


@pytest.mark.parametrize(
    "source",
    [
        "from slotune.tuner.space import SearchSpace\n",
        "import slotune.reports.fmt\n",
        "def f():\n    from slotune.tuner import space\n    return space\n",  # lazy
        "from ..tuner import space\n",  # relative
        "from slotune.server import app\n",  # the engine below its server
    ],
)
def test_an_upward_import_is_found(tmp_path: Path, source: str) -> None:
    root = _package(
        tmp_path,
        {
            "engine/scheduler.py": source,
            "server/app.py": "",
            "tuner/space.py": "",
            "reports/fmt.py": "",
        },
    )
    found = violations(root)
    assert len(found) == 1 and "engine/scheduler.py" in found[0], found


def test_downward_and_sideways_imports_pass(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "engine/scheduler.py": "from slotune.engine.config import X\nfrom . import config\n",
            "engine/config.py": "",
            "tuner/space.py": "from slotune.engine.scheduler import S\nimport slotune._extras\n",
            "_extras.py": "",
        },
    )
    assert violations(root) == []
