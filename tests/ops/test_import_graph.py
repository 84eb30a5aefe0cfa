"""snip_ops' modules import one another without a cycle. Every import counts, at module level or inside a
function (an import moved into a function still runs, it only runs later), so that each module can be read,
tested and loaded after the modules it uses: `_ext`, which every kernel caller imports, imports none of them."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "snip_ops"


def _modules() -> dict[str, Path]:
    """{dotted name: source file} of the package's Python modules (the package itself for __init__.py)."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _bound_names(path: Path) -> set[str]:
    """The names a module binds at its top level (what `from module import name` can take from it)."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's Python modules that module `name` imports anywhere in its source. `from package import x`
    where x is neither a Python module nor a name the package binds imports a compiled module (the extension
    snip_ops._C): no Python module, no edge."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    found.add(submodule)
                elif base in modules and (modules[base].name != "__init__.py"
                                          or alias.name in _bound_names(modules[base])):
                    found.add(base)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once every path from it is explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_the_graph_sees_module_and_function_level_imports():
    graph = import_graph()
    assert "snip_ops._ext" in graph["snip_ops.linear"]  # from . import _ext
    assert "snip_ops.gemm_kernels" in graph["snip_ops.gemm"]  # inside a function
    assert "snip_ops.self_check" in graph["snip_ops"]


def test_snip_ops_imports_have_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "snip_ops import cycle: " + " -> ".join(cycle)


def test_ext_is_a_leaf():
    """The extension's loader imports no other module of the package (its compiled _C is not a Python module)."""
    assert import_graph()["snip_ops._ext"] == set()
