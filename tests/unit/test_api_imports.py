"""The API depends on what it uses, not on the node: no module of ``dispatcher.api`` imports
``dispatcher.node``, directly or through the modules it imports, not even for type checking.

Read from the source (``ast``), every import statement counted wherever it stands (module level,
inside a function, under ``if TYPE_CHECKING``). Importing the modules would not tell: the package
``dispatcher`` itself re-exports ``Node``, so any import of a submodule loads the node first."""

from __future__ import annotations

import ast
from pathlib import Path

import dispatcher

ROOT = Path(dispatcher.__file__).parent
PACKAGE = "dispatcher"


def module_file(module: str) -> Path | None:
    """The source of a module of the dispatcher package, or None (another package, a name)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = ROOT.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    """The dispatcher modules ``path`` imports. ``from dispatcher import X`` names the module
    ``dispatcher.X`` when there is one, else an attribute of the package, which is loaded before
    any of its modules anyway (``__version__``); ``Node`` is reported as the node itself."""
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    found: set[str] = set()
    for statement in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(statement, ast.Import):
            found.update(alias.name for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom):
            origin = statement.module or ""
            if statement.level:
                anchor = package.split(".")[: len(package.split(".")) - statement.level + 1]
                origin = ".".join([*anchor, origin] if origin else anchor)
            for alias in statement.names:
                submodule = f"{origin}.{alias.name}"
                if module_file(submodule) is not None:
                    found.add(submodule)
                elif origin == PACKAGE and alias.name == "Node":
                    found.add(f"{PACKAGE}.node")
                elif origin != PACKAGE:
                    found.add(origin)
    return {name for name in found if module_file(name) is not None}


def import_paths(start: list[str]) -> dict[str, list[str]]:
    """Every dispatcher module reachable from ``start``, with one chain of imports leading to it."""
    chains = {name: [name] for name in start}
    pending = list(start)
    while pending:
        current = pending.pop()
        source = module_file(current)
        assert source is not None, current
        for name in sorted(imported(source)):
            if name not in chains:
                chains[name] = [*chains[current], name]
                pending.append(name)
    return chains


def api_modules() -> list[str]:
    return sorted(module_name(path) for path in (ROOT / "api").rglob("*.py"))


def test_no_module_of_the_api_imports_the_node() -> None:
    chains = import_paths(api_modules())
    assert "dispatcher.api.deps" in chains
    assert "dispatcher.node" not in chains, " -> ".join(chains.get("dispatcher.node", []))


def test_the_walk_finds_the_node_where_it_is_imported() -> None:
    # The check above must be able to fail: the composition root reaches the node's own module
    # (it is the start), and the package's __init__ reaches it through ``from ... import Node``.
    chains = import_paths(["dispatcher"])
    assert chains["dispatcher.node"] == ["dispatcher", "dispatcher.node"]
    assert "dispatcher.api" in import_paths(["dispatcher.node"])
