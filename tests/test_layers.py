"""The package's layers point one way: every import of a specserve module points down or sideways.

    cli -> measure (bench, measure) -> cluster -> server -> engine -> auto -> drafting -> backends -> base

and within the server: app (the routes, lifespan) -> apis -> state -> core -> http.

Each module is mapped to its layer by name (longest prefix wins); the imports are read with `ast`, so
imports inside functions and under TYPE_CHECKING count too: an import placed in a function is still a
dependency. A new module must be placed in LAYERS; a module that needs a higher layer's code is in the
wrong layer, or the code is.
"""
from __future__ import annotations

import ast
from pathlib import Path

import specserve

ROOT = Path(specserve.__file__).parent

# lowest first; a name is a module or a package (all its modules)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("specserve", "config", "text", "chat", "prompt", "fim", "stats", "gguf_meta", "batchcost", "policy")),
    ("backends", ("backends", "models", "f16", "memory", "offload", "fit", "pairing", "stores")),
    ("drafting", ("sampling", "top_k", "processors", "logprobs", "verifier", "steps", "drafters", "grammar")),
    # auto reads the drafters' names (drafters.hybrid.LOOKUPS) and the policy protocol; the engine reads auto
    ("auto", ("auto", "learned")),
    ("engine", ("engine", "slot", "commit", "loading", "draft_choice", "draft_pins")),
    # the server's own layers: the edge (http/), what serves any request (core/), the state of one server
    # (state.py: it builds core's scheduler and metrics), the APIs over them, and the app that routes to each API
    ("server.http", ("server.http",)),
    ("server.core", ("server.core",)),
    ("server.state", ("server.state",)),
    ("server.apis", ("server.apis",)),
    ("server", ("server",)),
    ("cluster", ("cluster",)),
    ("router", ("router",)),  # beside cluster: runs servers, imports the server's edge (errors, body, guards)
    ("measure", ("bench", "measure")),
    ("cli", ("cli", "__main__")),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["specserve", *parts])


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer_of(module: str) -> str | None:
    """The layer of specserve.X.Y: the longest prefix named in LAYERS."""
    rest = module.split(".")[1:]
    best, best_len = None, -1
    for layer, names in LAYERS:
        for name in names:
            prefix = [] if name == "specserve" else name.split(".")
            if rest[:len(prefix)] == prefix and len(prefix) > best_len:
                best, best_len = layer, len(prefix)
    return best


def imports(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported specserve module) for every import in the file, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "specserve"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "specserve":
                continue
            # `from . import learned` imports a module; `from .engine import Engine` a name of one
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            found += [(node.lineno, m) for m in subs]
            if len(subs) < len(node.names):
                found.append((node.lineno, target))
    return found


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if layer_of(m) is None]
    assert not unplaced, f"place these modules in tests/test_layers.py's LAYERS: {unplaced}"


def test_imports_point_down_or_sideways():
    mods = modules()
    known = set(mods)
    upward = []
    for module, path in mods.items():
        here = layer_of(module)
        if here is None:
            continue  # reported by test_every_module_has_a_layer
        for line, target in imports(module, path, known):
            there = layer_of(target)
            if there is not None and RANK[there] > RANK[here]:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} ({here}) imports {target} ({there})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_source_file_is_over_400_lines():
    """A module past 400 lines holds more than one thing: split out a cohesive piece (placed in LAYERS),
    rather than pack lines (ruff holds them to 120 characters)."""
    lengths = {p: len(p.read_text().splitlines()) for p in sorted(ROOT.rglob("*.py"))}
    assert len(lengths) > 100 and max(lengths.values()) > 300  # the package, not an empty folder
    long = [f"{p.relative_to(ROOT.parent)}: {n} lines" for p, n in lengths.items() if n > 400]
    assert not long, "split these modules:\n" + "\n".join(long)


def test_layer_map_reads_the_package():
    """The map is not vacuous: the package's layers are where the README's picture puts them."""
    assert layer_of("specserve.cli.serve") == "cli"
    assert layer_of("specserve.cluster.replica") == "cluster"
    assert layer_of("specserve.server.app") == "server"
    assert layer_of("specserve.server.http.listener") == "server.http"
    assert layer_of("specserve.server.core.jobs") == "server.core"
    assert layer_of("specserve.server.state") == "server.state"
    assert layer_of("specserve.server.apis.openai.chat") == "server.apis"
    assert RANK["server.http"] < RANK["server.core"] < RANK["server.state"] < RANK["server.apis"] < RANK["server"]
    assert layer_of("specserve.engine") == "engine"
    assert layer_of("specserve.drafters.suffix") == "drafting"
    assert layer_of("specserve.backends.llama_cpp") == "backends"
    mods = modules()
    found = {m for _, m in imports("specserve.cluster.replica", mods["specserve.cluster.replica"], set(mods))}
    assert {"specserve.server", "specserve.server.logsafe", "specserve.loading"} <= found


def test_the_batch_backend_needs_nothing_of_the_single_one():
    """llama_cpp's model builds the shared context; the shared context needs only llama_native, whose
    NativeModel protocol stands for the model, so the two files make no circle, not even for a type."""
    graph = import_graph()
    assert "specserve.backends.llama_cpp" not in graph["specserve.backends.llama_cpp_batch"]
    assert "specserve.backends.llama_native" in graph["specserve.backends.llama_cpp_batch"]


APIS = "specserve.server.apis."
# the one way an API's package may read another's: OpenAI's answers carry llama-server's extensions
# (`__verbose`, its answer in /completion's shape, and the system fingerprint /props reports)
API_READS = {("openai", "llama")}


def test_api_packages_read_only_shared():
    """server/apis/ is one package per API (openai, anthropic, llama) beside shared/: an API reads shared/,
    core and http, not another API's package (but API_READS), and shared/ reads no API, so that the next
    API is a package of its own with a declaration (shared/builder.py's Api)."""
    crossing = []
    for module, targets in import_graph().items():
        if not module.startswith(APIS) or module.count(".") < 4:
            continue
        here = module[len(APIS):].split(".")[0]
        for target in targets:
            there = target[len(APIS):].split(".")[0] if target.startswith(APIS) else None
            if there not in (None, here, "shared") and (here, there) not in API_READS:
                crossing.append(f"{module} imports {target}")
    assert {m.split(".")[3] for m in modules() if m.startswith(APIS)} >= {"openai", "anthropic", "llama", "shared"}
    assert not crossing, "an API's package reads another's:\n" + "\n".join(crossing)


# Circles that remain, each with the issue that removes it. A circle not listed fails; a listed one that
# is gone fails too, so that the list is kept true.
KNOWN_CIRCLES: list[set[str]] = []  # none left; a circle kept on purpose would be named here, with why


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of specserve modules: all of them, those for type checkers
    (under TYPE_CHECKING) and those inside functions too. A type needed both ways is a
    circle all the same: it belongs in a lower module, or in a Protocol."""
    mods = modules()
    known = set(mods)
    return {module: {t for _, t in imports(module, path, known) if t in known} for module, path in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    found = circles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not new, f"import circles: {new}"
    assert not gone, f"these circles are gone: remove them from KNOWN_CIRCLES: {gone}"


def test_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_test_module_imports_another():
    """The tests' own layers: what several test modules share is in a helper module (server_fixtures.py,
    lossless_checks.py, tests/auto/step_simulator.py, ...), not read out of another test module, whose
    tests would then run, and break, for reasons of the other's."""
    tests = Path(__file__).parent
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(tests)}:{node.lineno}: {n}" for n in names
                      if n.split(".")[-1].startswith("test_") or n.startswith("tests.test_")]
    assert len(list(tests.rglob("test_*.py"))) > 50  # the test tree, not an empty folder
    assert not found, "move what these take into a helper module:\n" + "\n".join(found)
