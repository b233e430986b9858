"""The dependency direction of docs/architecture.md (its package table), read from the
import statements themselves: the runtime never reaches up into the API or the compiler
driver, the layers under the driver never import it, and nothing in ``tempo`` imports the
RL or LLM packages."""

import ast
from pathlib import Path

import pytest

TEMPO = Path(__file__).resolve().parent.parent / "tempo"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (type-checking and lazy imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules(package: str) -> list[Path]:
    root = TEMPO / package
    return sorted(root.rglob("*.py")) if root.is_dir() else [TEMPO / f"{package}.py"]


def _reaching(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(name for name in _imports(path)
                  if any(name == f or name.startswith(f + ".") for f in forbidden))


@pytest.mark.parametrize("package,forbidden", [
    ("runtime", ("tempo.api", "tempo.compiler", "tempo.passes")),
    ("schedule", ("tempo.api", "tempo.compiler", "tempo.runtime", "tempo.passes")),
    ("passes", ("tempo.api", "tempo.compiler", "tempo.runtime", "tempo.schedule")),
    ("analysis", ("tempo.api", "tempo.compiler", "tempo.runtime", "tempo.passes", "tempo.schedule")),
    ("ir", ("tempo.api", "tempo.compiler", "tempo.runtime", "tempo.passes", "tempo.schedule",
            "tempo.analysis")),
    ("symbolic", ("tempo.api", "tempo.compiler", "tempo.runtime", "tempo.passes", "tempo.schedule",
                  "tempo.analysis", "tempo.ir")),
    ("options", ("tempo.api", "tempo.compiler", "tempo.runtime", "tempo.passes", "tempo.schedule")),
])
def test_lower_layers_do_not_import_higher_ones(package, forbidden):
    modules = _modules(package)
    assert modules
    offending = {str(p.relative_to(TEMPO)): _reaching(p, forbidden) for p in modules}
    assert not {k: v for k, v in offending.items() if v}


def test_nothing_in_tempo_imports_the_rl_or_llm_packages():
    offending = {str(p.relative_to(TEMPO)): _reaching(p, ("tempo_rl", "tempo_llm"))
                 for p in TEMPO.rglob("*.py")}
    assert not {k: v for k, v in offending.items() if v}
