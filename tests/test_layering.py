"""Imports point one way (docs/design.md): snip_ops <- planner (and its stability numerics) <- snip_train.

The libraries are imported module by module in a fresh interpreter, which must not load the
application; the application, the benchmarks (bench/) and the planner-quality studies (experiments/) reach
the planner through its public names only; neither the libraries nor the application import bench or
experiments; the libraries' tests do not use the application either; and no code of bench/, experiments/
or tests/ edits sys.path (they import each other as packages from the source tree's root)."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("snip_ops", "planner")


# Integrations import the framework they plug into, an optional dependency: checked where it is installed.
FRAMEWORKS = {"planner.integrations.torchtitan": "torchtitan", "planner.integrations.hf_trainer": "transformers"}


def _importable(module: str) -> bool:
    return all(importlib.util.find_spec(framework) is not None
               for prefix, framework in FRAMEWORKS.items() if module == prefix or module.startswith(prefix + "."))


def _modules(package: str) -> list[str]:
    root = ROOT / package
    names = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in sorted(root.rglob("*.py"))]
    return [n for n in names if _importable(n)]


def test_libraries_do_not_import_the_application():
    modules = [m for package in LIBRARIES for m in _modules(package)]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "app = sorted(m for m in sys.modules if m == 'snip_train' or m.startswith('snip_train.'))\n"
            "assert not app, f'a library imported the application: {app}'\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_snip_ops_does_not_import_the_planner():
    code = ("import importlib, sys\n"
            f"for name in {_modules('snip_ops')!r}:\n"
            "    importlib.import_module(name)\n"
            "assert 'planner' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _imported(path: Path) -> list[str]:
    """The modules `path` imports (absolute imports; `from a.b import c` counts as a.b)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
    return out


@pytest.mark.parametrize("package", ["snip_train", "bench", "experiments"])
def test_the_planners_users_use_its_public_surface(package):
    """The application, the benchmarks and the studies import `planner` and `planner.stability` names that those
    packages export, nothing else."""
    import planner
    import planner.stability

    public = {"planner": set(planner.__all__), "planner.stability": set(planner.stability.__all__)}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "planner":
                assert node.module in public, f"{path.relative_to(ROOT)} imports {node.module}"
                names = {a.name for a in node.names}
                assert names <= public[node.module], f"{path.relative_to(ROOT)}: {sorted(names - public[node.module])}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("planner.") for a in node.names), path


def test_the_libraries_and_the_application_do_not_import_bench_or_experiments():
    for package in (*LIBRARIES, "snip_train"):
        for path in sorted((ROOT / package).rglob("*.py")):
            found = [m for m in _imported(path) if m.split(".")[0] in ("bench", "experiments")]
            assert not found, f"{path.relative_to(ROOT)} imports {found}"


def _edits_sys_path(node: ast.AST) -> bool:
    """An assignment to sys.path (or a slice of it), or a call of sys.path.insert / append / extend."""
    def is_sys_path(n):
        n = n.value if isinstance(n, ast.Subscript) else n
        return isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name) and n.value.id == "sys"
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_sys_path(t) for t in targets)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("insert", "append", "extend") and is_sys_path(node.func.value))


def test_no_sys_path_edits_in_bench_experiments_and_tests():
    edits = [f"{path.relative_to(ROOT)}:{node.lineno}" for package in ("bench", "experiments", "tests")
             for path in sorted((ROOT / package).rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text())) if _edits_sys_path(node)]
    assert not edits, f"sys.path edited at {edits}: import through the packages instead"


def test_the_sys_path_check_sees_each_form_of_edit():
    for code in ("import sys\nsys.path.insert(0, 'x')", "import sys\nsys.path.append('x')",
                 "import sys\nsys.path.extend(['x'])", "import sys\nsys.path[:0] = ['x']", "import sys\nsys.path = []",
                 "import sys\nsys.path += ['x']"):
        assert any(_edits_sys_path(n) for n in ast.walk(ast.parse(code))), code
    assert not any(_edits_sys_path(n) for n in ast.walk(ast.parse("import sys\nprint(sys.path[0])")))


def test_library_tests_do_not_build_the_application():
    """tests/ops and tests/planner test the libraries with models of their own (or a Hugging Face one)."""
    for path in sorted((ROOT / "tests" / "ops").glob("*.py")) + sorted((ROOT / "tests" / "planner").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "snip_train" for n in names), f"{path.relative_to(ROOT)} imports {names}"
