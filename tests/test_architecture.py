"""One direction of dependency: the import graph of ``recbole_freq`` and ``dataset_prep``
has no cycle, and no module imports one of a layer above its own.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
anywhere in a file (inside functions too), and for an imported module the package
``__init__`` files Python runs to reach it.  ``LAYERS`` is the one place the layers are
written down; README's "Architecture" section draws them, in this order.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dataset_prep", "recbole_freq")
# A function says one step; a longer one is split into named steps.
MAX_FUNCTION_LINES = 80

# Bottom first.  A module belongs to the layer naming its longest prefix; it may import
# its own layer and those below, never one above.
LAYERS = [
    ("dataset_prep: basics", ["dataset_prep.errors", "dataset_prep.parsing",
                               "dataset_prep.atomic", "dataset_prep.stats"]),
    ("dataset_prep: raw logs", ["dataset_prep.raw", "dataset_prep.procedure"]),
    ("dataset_prep: formats", ["dataset_prep.amazon", "dataset_prep.lastfm",
                                "dataset_prep.movielens", "dataset_prep.yelp",
                                "dataset_prep.one_line", "dataset_prep.tabular"]),
    ("dataset_prep: sources", ["dataset_prep.download"]),
    ("dataset_prep: registry", ["dataset_prep.registry"]),
    ("dataset_prep: pipeline", ["dataset_prep.pipeline"]),
    ("dataset_prep: command line", ["dataset_prep.cli", "dataset_prep.__main__",
                                     "dataset_prep"]),
    ("utils", ["recbole_freq.utils"]),
    ("compat", ["recbole_freq.compat"]),
    ("model", ["recbole_freq.model"]),
    ("protocol, data", ["recbole_freq.protocol", "recbole_freq.data"]),
    ("config", ["recbole_freq.config"]),
    ("checkpoint", ["recbole_freq.checkpoint"]),
    ("run", ["recbole_freq.quick_start"]),
    ("jobs", ["recbole_freq.jobs"]),
    ("command line", ["recbole_freq.cli", "recbole_freq.__main__", "recbole_freq"]),
]  # fmt: skip


def module_files(root: Path = REPO_ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``PACKAGES``."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _enclosing_packages(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(name: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that importing module ``name`` (whose source is
    ``source``) runs: each one named by an import statement anywhere in it, and the
    packages on the way to it that do not also enclose ``name``."""
    targets = set()
    here = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                # ``from package import module`` imports that module (and the package on
                # the way, below); any other name is read from the module itself.
                submodule = f"{module}.{alias.name}"
                targets.add(submodule if submodule in known else module)
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if not target or target == name:
            continue
        found.add(target)
        mine = set(_enclosing_packages(name)) | {name}
        found.update(p for p in _enclosing_packages(target) if p in known and p not in mine)
    return found


def import_graph(root: Path = REPO_ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {
        name: imports_of(name, path.read_text(encoding="utf-8"), path.name == "__init__.py", known)
        for name, path in files.items()
    }


def layer_of(name: str, layers=LAYERS) -> int | None:
    best, best_length = None, -1
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    return best


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    problems = []
    for name in sorted(graph):
        own = layer_of(name, layers)
        for target in sorted(graph[name]):
            theirs = layer_of(target, layers)
            if own is not None and theirs is not None and theirs > own:
                problems.append(f"{name} ({layers[own][0]}) imports {target} ({layers[theirs][0]})")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
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


# ------------------------------------------------------------------ the checks themselves


def test_the_checks_find_a_cycle_an_upward_import_and_a_package_on_the_way():
    layers = [("low", ["pkg.low"]), ("high", ["pkg.high"])]
    known = {"pkg", "pkg.low", "pkg.low.a", "pkg.high", "pkg.high.b"}
    # A function-level import counts, and importing pkg.high.b runs pkg.high's __init__.
    low = imports_of("pkg.low.a", "def f():\n    from pkg.high import b\n", False, known)
    assert low == {"pkg.high", "pkg.high.b"}
    high = imports_of("pkg.high.b", "from ..low import a\n", False, known)
    assert high == {"pkg.low", "pkg.low.a"}
    # A sibling module is no import of the package both are in; a name of it is.
    assert imports_of("pkg.high.b", "from . import b\n", False, known) == set()
    assert imports_of("pkg.low.a", "from pkg.low import NAME\n", False, known) == {"pkg.low"}
    graph = {"pkg.low.a": low, "pkg.high.b": high, "pkg.high": set(), "pkg.low": set()}
    assert upward_imports(graph, layers) == [
        "pkg.low.a (low) imports pkg.high (high)",
        "pkg.low.a (low) imports pkg.high.b (high)",
    ]
    assert cycles(graph) == [["pkg.high.b", "pkg.low.a"]]


# ------------------------------------------------------------------ the code base


def test_every_module_is_in_a_layer():
    assert [name for name in module_files() if layer_of(name) is None] == []


def test_no_import_runs_in_a_circle():
    assert cycles(import_graph()) == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(import_graph()) == []


def function_lengths(root: Path = REPO_ROOT) -> dict[str, int]:
    """``module:function`` (``module:Class.method``) -> lines, for every function of
    ``PACKAGES``, nested ones counted within the function that holds them."""
    lengths = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[f"{prefix}{child.name}"] = child.end_lineno - child.lineno + 1

    for module, path in module_files(root).items():
        visit(ast.parse(path.read_text(encoding="utf-8")), f"{module}:")
    return lengths


def test_the_length_check_sees_methods_and_nested_functions(tmp_path):
    package = tmp_path / "recbole_freq"
    package.mkdir()
    (tmp_path / "dataset_prep").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(3))
    (package / "m.py").write_text(
        f"class A:\n    def f(self):\n{body}\n\n        def inner():\n            pass\n"
    )
    assert function_lengths(tmp_path) == {"recbole_freq.m:A.f": 7}


def test_no_function_is_longer_than_80_lines():
    lengths = function_lengths()
    assert {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES} == {}


def test_readme_draws_the_layers_in_this_order():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    drawn = re.findall(r"^\s*\|?\s*\d+\s+(\S[^|\n]*?)\s{2,}", section, flags=re.M)
    assert drawn == [name for name, _ in reversed(LAYERS)]


# ------------------------------------------------------------ names files have recorded


def test_names_recorded_before_the_layout_still_resolve():
    """Checkpoints, resume states and run files name the config class, its yaml loader
    and the model classes by module path; the paths they recorded before the package was
    laid out in layers resolve to the same classes, by pickle and by the safe loaders."""
    import pickle

    from recbole_freq.checkpoint.safe_pickle import allowed_globals
    from recbole_freq.checkpoint.schema import allowed_class
    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.model.sequential_recommender.bsarec import BSARec
    from recbole_freq.utils.property_files import SafeConfigLoader

    for module, name, expected in [
        ("recbole_freq.config", "FreqConfig", FreqConfig),
        ("recbole_freq.config", "SafeConfigLoader", SafeConfigLoader),
        ("recbole_freq.model.sequential_recommender.bsarec", "BSARec", BSARec),
    ]:
        # A protocol-2 pickle of the class by reference: GLOBAL 'module name', STOP.
        recorded = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"."
        assert pickle.loads(recorded) is expected
        assert (expected.__module__, expected.__qualname__) == (module, name)
    assert allowed_class("recbole_freq.config", "SafeConfigLoader") is SafeConfigLoader
    assert allowed_class("recbole_freq.model.sequential_recommender.bsarec", "BSARec") is BSARec
    recorded_config = ("recbole_freq.config", "FreqConfig")
    assert allowed_globals([recorded_config])[recorded_config][0] is FreqConfig
