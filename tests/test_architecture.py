"""The layering of docs/architecture.md, checked on the code: every import of every module of
loopscale/ (read with `ast`, those inside functions included) goes to the same layer or one
below, no modules import each other round a circle, and the table names every top-level
package and module. Nothing is imported or run."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "loopscale"


def layers() -> dict[str, int]:
    """Top-level name (`train`, `cli`, ...) -> its layer, from docs/architecture.md's table."""
    out = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for name in re.findall(r"`([a-z_]+)`", cells[1]):
                out[name] = int(cells[0])
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path) -> set[str]:
    """The loopscale modules `path` imports. `from loopscale.a import b` is an import of the
    module a.b where there is one (a package's face is not what is used), else of a."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "loopscale"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "loopscale":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if is_module(sub) else node.module)
    return out


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package itself


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_table_names_every_part_of_the_package():
    table = layers()
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert parts - set(table) == set(), "add these to docs/architecture.md's table"
    assert set(table) - parts == set(), "the table names parts that are not in loopscale/"


def test_no_import_runs_back_up_a_layer():
    table = layers()
    upward = [f"{m} (layer {table[top(m)]}) imports {o} (layer {table[top(o)]})"
              for m, outs in graph().items() for o in sorted(outs)
              if top(m) and top(o) and table[top(o)] > table[top(m)]]
    assert upward == []


def test_no_modules_import_each_other():
    assert circles(graph()) == []


def test_the_checks_see_what_they_are_meant_to():
    """The rules are only as good as the import reader: it must see lazy imports, and the
    circle finder must find a circle."""
    edges = graph()
    assert "loopscale.train.trainer" in edges["loopscale.job"]  # imported inside run()
    assert "loopscale.parallel.mesh" in edges["loopscale.rundir.load"]  # `import mesh as ..`
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_library_never_imports_what_is_built_on_it():
    above = {"experiments", "sweeps", "analysis", "benchmarks", "tests"}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            assert not {n.split(".")[0] for n in names} & above, (path, names)
