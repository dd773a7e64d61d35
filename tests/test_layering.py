"""The import structure docs/ARCHITECTURE.md promises: imports go one way, bottom to top, and no
module imports itself round a circle, counting imports inside functions too."""

from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# docs/ARCHITECTURE.md's layers: a module imports only from its own layer or the layers below it
LAYERS = {
    "types": 1, "geometry": 1, "runinfo": 1, "stats": 1, "names": 1, "configs": 1, "faults": 1, "cpu_steal": 1, "compile_cache": 1, "parallel": 1,
    "scenes": 2, "sim": 2, "pdm": 2, "planners": 2, "render": 2, "pdm_reference": 2,
    "text": 3, "data": 3, "models": 3, "sampling": 3, "kernels": 3,
    "rollout": 4, "rl": 4, "coop": 4, "distributed": 4, "carla": 4, "serve": 4, "evaluate": 4, "adapters": 4,
    "pipelines": 5, "cli": 5,
}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in [*(ROOT / "jax_drive").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imported(path: pathlib.Path, package: str) -> set[str]:
    """Every jax_drive / kernels module named by an import anywhere in the file (absolute
    names; ``from a import b`` counts ``a`` and ``a.b``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return {n for n in names if n.split(".")[0] in ("jax_drive", "kernels")}


def import_graph() -> dict[str, set[str]]:
    mods = modules()

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = collections.defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in imported(path, package):
            module = resolve(target)
            if module and module != name and not name.startswith(module + "."):  # a package's own __init__
                graph[name].add(module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for start in list(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get("kernels" if parts[0] == "kernels" else (parts[1] if len(parts) > 1 else ""))


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_go_one_way_bottom_to_top():
    mods = modules()
    unknown = sorted(m for m in mods if m not in ("jax_drive",) and layer(m) is None)
    assert unknown == [], f"modules outside every layer: {unknown} (add them to LAYERS and ARCHITECTURE.md)"
    upward = sorted(f"{src} -> {dst}" for src, targets in import_graph().items() for dst in targets
                    if layer(src) is not None and layer(dst) is not None and layer(dst) > layer(src))
    assert upward == []
