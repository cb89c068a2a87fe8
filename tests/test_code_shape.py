"""The shape of the code (docs/design.md, house rules 2 and 11; issue #30): short functions,
short module docstrings that point to docs/design.md, no private name used across modules,
and one k3 estimator. Parses every module of src/rlbatch with `ast`; imports nothing."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rlbatch"
MAX_FUNCTION_LINES = 60
MAX_DOCSTRING_LINES = 25


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(SRC.parent)): ast.parse(p.read_text(), filename=str(p))
            for p in sorted(SRC.rglob("*.py"))}


MODULES = _modules()
# dotted names of every rlbatch module: rlbatch.analysis.labels, rlbatch.backends.trl, ...
MODULE_NAMES = {rel[:-3].replace("/", ".").removesuffix(".__init__") for rel in MODULES}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _functions(tree: ast.Module):
    """(qualified name, node) of every function and method, nested ones included."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child
                yield from walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """Local names bound to rlbatch modules by this module's imports -> the module's name."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULE_NAMES:
                    out[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlbatch"):
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULE_NAMES:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def test_no_function_over_60_lines():
    long = [f"{rel}: {name} has {node.end_lineno - node.lineno + 1} lines "
            f"(at most {MAX_FUNCTION_LINES})"
            for rel, tree in MODULES.items() for name, node in _functions(tree)
            if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], f"{len(long)} function(s) too long:\n" + "\n".join(long)


def test_module_docstrings_are_short():
    long = []
    for rel, tree in MODULES.items():
        first = tree.body[0] if tree.body else None
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            n = first.end_lineno - first.lineno + 1
            if n > MAX_DOCSTRING_LINES:
                long.append(f"{rel}: module docstring has {n} lines "
                            f"(at most {MAX_DOCSTRING_LINES}; detail goes to docs/design.md)")
    assert long == [], f"{len(long)} module docstring(s) too long:\n" + "\n".join(long)


def test_no_private_name_imported_across_modules():
    bad = []
    for rel, tree in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlbatch"):
                bad += [f"{rel}:{node.lineno}: imports {a.name} from {node.module}"
                        for a in node.names if _private(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.level:
                bad += [f"{rel}:{node.lineno}: imports {a.name} by a relative import"
                        for a in node.names if _private(a.name)]
    assert bad == [], f"{len(bad)} private name(s) imported across modules:\n" + "\n".join(bad)


def test_no_private_attribute_of_another_module():
    bad = []
    for rel, tree in MODULES.items():
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            base = ast.unparse(node.value)
            module = aliases.get(base) or (base if base in MODULE_NAMES else None)
            if module:
                bad.append(f"{rel}:{node.lineno}: uses {module}.{node.attr}")
    assert bad == [], f"{len(bad)} private attribute(s) of other modules:\n" + "\n".join(bad)


def test_one_k3_estimator():
    k3 = [f"{rel}: {name}" for rel, tree in MODULES.items() for name, _ in _functions(tree)
          if "k3" in name.split(".")[-1]]
    assert len(k3) == 1, f"{len(k3)} functions named *k3* (want exactly 1): {k3}"
