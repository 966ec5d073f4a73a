"""The house as its imports say: no module imports one that stands above it, and no two modules import each
other (directly or round a longer circle) when they load. Read from the source's syntax, nothing imported."""

import ast
import importlib.util
from pathlib import Path

# The packages, each a folder of the repository (pyproject's package-dir): mmjudge/ holds the API.
PACKAGES = ("mmjudge.judge", "mmjudge.infer", "mmjudge.train", "mmjudge.calibration", "mmjudge.serve", "mmjudge.demo", "mmjudge")
COMMANDS = ("mmjudge.infer", "mmjudge.train", "mmjudge.calibration", "mmjudge.serve", "mmjudge.demo")
# (whose imports, what they must not import, why): a package is named with its modules, anywhere in a module.
RULES = [
    ("mmjudge.judge", (*COMMANDS, "mmjudge.api"), "judge/ is what every command shares; it depends on none of them, nor on the API over them"),
    *((command, ("mmjudge.api",), "the Python API is a door over the commands' engines: it imports them, never the reverse") for command in COMMANDS),
]


def module_sources() -> dict[str, Path]:
    """Every module of the packages, by its dotted name, read wherever they are imported from: the checkout under
    an editable install, site-packages under a wheel's (make test-installed removes the checkout's copy)."""
    modules = {}
    for package in PACKAGES:
        folder = Path(importlib.util.find_spec(package).submodule_search_locations[0])
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            modules[".".join((package, *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])))] = path
    assert len(modules) > 100, modules  # the walk found the packages
    return modules


def imported(module: str, path: Path, modules: dict[str, Path], node: ast.AST) -> set[str]:
    """The modules of ours an import statement names: a name imported from a package is its submodule where it
    is one, else the package's own (its __init__). The packages above a module, which Python loads first, are
    left out: they hold no more than what they import of their own modules."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
        source = ".".join(filter(None, (base, node.module)))
        names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names]
    else:
        return set()
    return {name for name in names if name in modules}


def top_level(tree: ast.Module):
    """The statements that run when the module loads: not those in a function's body, nor under TYPE_CHECKING."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending += node.orelse
            continue
        yield node
        pending += ast.iter_child_nodes(node)


def import_graph(load_time_only: bool) -> dict[str, set[str]]:
    modules = module_sources()
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = top_level(tree) if load_time_only else ast.walk(tree)
        graph[module] = set().union(*(imported(module, path, modules, node) for node in nodes)) - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_one_above_it():
    graph = import_graph(load_time_only=False)
    offenders = [f"{module} imports {target}: {why}" for importer, banned, why in RULES for module, targets in sorted(graph.items())
                 if module == importer or module.startswith(importer + ".")
                 for target in sorted(targets) if any(target == b or target.startswith(b + ".") for b in banned)]
    assert offenders == []


def test_no_two_modules_import_each_other_when_they_load():
    """judge/model.py imported the backbone adapters, and they imported its CheckpointError, JudgeSettings and
    read_json_object: what both share is judge/checkpoint.py, one floor down."""
    assert circles(import_graph(load_time_only=True)) == []


def test_no_two_modules_import_each_other_even_inside_a_function():
    """serve/app.py's build_app imported serve/rewards.py in its body, and rewards.py imported app.py's Service
    and handler helpers: what both share is serve/service.py, one floor down. judge/backbones/__init__.py
    imported the Qwen-VL adapter in backbone_of, which imported the package's Backbone: that is
    judge/backbones/base.py now. load_judge (judge/model.py) handed a checkpoint with a reward head to
    judge/reward_model.py, which built the Judge with model.py's own loading: the reward model's module is the
    architecture alone now (its classes, heads and weights, over judge/checkpoint.py), and model.py loads it."""
    assert circles(import_graph(load_time_only=False)) == []
