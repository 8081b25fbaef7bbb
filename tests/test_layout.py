"""The shape a newcomer relies on: no import cycle among the library's modules (lazy and
``TYPE_CHECKING`` imports included), and a public API that is exactly ``__all__``."""

from __future__ import annotations

import ast
from pathlib import Path

import abstract_client

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("abstract_client", "providers")


def module_name(path: Path) -> str:
    """The name Python imports ``path`` by: the repository's ``providers/`` is
    ``abstract_client.providers`` (the wheel ships it there; a checkout maps it)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] == "providers":
        parts.insert(0, "abstract_client")
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every project module ``name`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from pkg import sub" imports the submodule; "from mod import name" the module
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []


def package_of(module: str) -> str:
    """``abstract_client.contract.run`` → ``contract``; the lanes are one package, ``providers``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_cycles_between_packages() -> None:
    """Layers, not only modules: no package imports another that imports it back (``http`` and
    ``contract`` once did, through ``parse_retry_after``; ``telemetry`` and ``contract`` through
    a type)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        for target in imports_of(name, path, known):
            a, b = package_of(name), package_of(target)
            graph.setdefault(a, set())
            graph.setdefault(b, set())
            if a != b:
                graph[a].add(b)
    assert cycles(graph) == []


def test_the_public_api_is_all_and_only_all() -> None:
    exported = set(abstract_client.__all__)
    assert len(exported) == len(abstract_client.__all__)
    for name in exported:
        assert getattr(abstract_client, name, None) is not None, name
    public = {n for n in vars(abstract_client) if not n.startswith("_")}
    subpackages = {"app", "contract", "errors", "fleet", "gateway", "http", "llm", "output", "provider", "registry"}
    subpackages |= {"http_lane", "images", "providers", "sdk", "stopping", "telemetry", "testing", "types", "wires"}
    assert public - exported - subpackages - {"annotations", "logging"} == set()


def test_implementation_modules_are_private_or_declare_all() -> None:
    missing = []
    for name, path in modules().items():
        leaf = name.split(".")[-1]
        if leaf.startswith("_") or (name.startswith("abstract_client.providers.") and leaf != "providers"):
            continue  # private, or a lane module (its public face is its registered name)
        if name.startswith(("abstract_client.testing", "abstract_client.app")):
            continue  # tools with their own documented surface
        if "__all__" not in path.read_text():
            missing.append(name)
    assert missing == []


def test_nothing_imports_a_generic_top_level_name() -> None:
    """An application's own ``providers`` (or ``tests``, ``app``) package must never be what the
    library imports: every absolute import of ours is under ``abstract_client``."""
    generic = {"providers", "tests", "app", "scripts", "benchmarks", "examples"}
    found = [f"{name}: {t}" for name, path in modules().items() for t in absolute_imports(path)]
    assert [f for f in found if f.split(": ")[1].split(".")[0] in generic] == []


def absolute_imports(path: Path) -> list[str]:
    """The modules ``path`` imports by an absolute name."""
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            targets.append(node.module or "")
    return targets


def test_every_file_is_one_module_object() -> None:
    """The repository's ``providers/`` is ``abstract_client.providers``, and only that: imported
    as ``providers`` it would be a second module object of every lane (``isinstance`` false
    across the two classes of one name). That import is refused, and nothing in the repository
    (tests, benchmarks, scripts, examples) writes it."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    probe = "import providers.openai_compatible"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "import the lanes as abstract_client.providers" in proc.stderr
    found = [
        f"{path.relative_to(root)}: {target}"
        for folder in ("tests", "benchmarks", "scripts", "examples", "abstract_client", "providers")
        for path in (root / folder).rglob("*.py")
        for target in absolute_imports(path)
        if target.split(".")[0] == "providers"
    ]
    assert found == []
    from abstract_client.providers import openai_compatible
    from abstract_client.registry import _factory

    assert _factory("openai-compatible") is openai_compatible.OpenAICompatibleProvider


def test_every_runtime_dependency_is_imported_by_the_library() -> None:
    """What ``pyproject.toml`` installs for every user is what the library imports (httpcore was
    declared and imported nowhere: httpx brings its own)."""
    import re
    import tomllib

    root = Path(__file__).resolve().parent.parent
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    imported: set[str] = set()
    for folder in ("abstract_client", "providers"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imported.add(node.module.split(".")[0])
    for requirement in declared:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].replace("-", "_").lower()
        assert name in imported, f"{requirement!r} is declared but nothing in the library imports {name}"
