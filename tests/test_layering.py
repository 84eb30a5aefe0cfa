"""Imports point one way (DESIGN.md): snip_ops <- planner (and its stability numerics) <- snip_train.

The libraries are imported module by module in a fresh interpreter, which must not load the
application; the application reaches the planner through its public names only; the libraries'
tests do not use the application either."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

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


def test_the_application_uses_the_planners_public_surface():
    """snip_train imports `planner` and `planner.stability` names that those packages export, nothing else."""
    import planner
    import planner.stability

    public = {"planner": set(planner.__all__), "planner.stability": set(planner.stability.__all__)}
    for path in sorted((ROOT / "snip_train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "planner":
                assert node.module in public, f"{path.relative_to(ROOT)} imports {node.module}"
                names = {a.name for a in node.names}
                assert names <= public[node.module], f"{path.relative_to(ROOT)}: {sorted(names - public[node.module])}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("planner.") for a in node.names), path


def test_library_tests_do_not_build_the_application():
    """tests/ops and tests/planner test the libraries with models of their own (or a Hugging Face one)."""
    for path in sorted((ROOT / "tests" / "ops").glob("*.py")) + sorted((ROOT / "tests" / "planner").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "snip_train" for n in names), f"{path.relative_to(ROOT)} imports {names}"
