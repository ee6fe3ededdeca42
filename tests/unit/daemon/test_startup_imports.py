"""The daemon imports every module of ours it will ever run before it serves (invariant 8).

During ``apt upgrade`` the old daemon serves until postinst restarts it, with the new
package's files already in place: a module of ours imported for the first time in that window
would be the new version's, inside the old process. So no function the daemon can run after
start-up may import a module of ours that start-up did not import already (an import of a
module already loaded is a lookup in ``sys.modules``, not a file read).

Read from the source (the AST), not by running the daemon: every path counts, taken or not.
Start-up is ``multusd serve`` (``__main__.serve`` and what it imports) and the Kubernetes
client's build, which runs once, at start, on its own thread (``kubestart``).
"""

from __future__ import annotations

import ast
import os
from typing import Dict, Iterator, List, Optional, Set, Tuple

import multusd

PACKAGE_DIR = os.path.dirname(multusd.__file__)
# (module, function) whose imports run at start-up only: serve before it serves, and the
# client build, started once by Daemon.run (a request needing the client waits for it)
START_UP = {("multusd.__main__", "serve"), ("multusd.daemon.kubestart", "BackgroundKube._build")}


def module_file(name: str) -> Optional[str]:
    parts = name.split(".")
    if parts[0] != "multusd":
        return None
    base = os.path.join(PACKAGE_DIR, *parts[1:])
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


class Imports:
    """The imports of one module of ours: at module level, and inside each function."""

    def __init__(self, name: str) -> None:
        self.name = name
        path = module_file(name)
        assert path is not None, name
        self.is_package = path.endswith("__init__.py")
        with open(path) as handle:
            self.tree = ast.parse(handle.read(), path)
        self.top: Set[str] = set()
        self.inside: List[Tuple[str, int, str]] = []  # (function, line, module imported)
        self.dynamic: List[Tuple[str, int]] = []
        self._walk(self.tree, "", False)

    def _walk(self, node: ast.AST, where: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                name = getattr(child, "name", "<lambda>")
                self._walk(child, f"{where}.{name}" if where else name, True)
            elif isinstance(child, ast.ClassDef):  # its body runs where the class statement is
                self._walk(child, f"{where}.{child.name}" if where else child.name, in_function)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                continue  # never executed
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in self._targets(child):
                    if in_function:
                        self.inside.append((where, child.lineno, target))
                    else:
                        self.top.add(target)
            else:
                if isinstance(child, ast.Call) and _is_dynamic_import(child.func):
                    self.dynamic.append((where, child.lineno))
                self._walk(child, where, in_function)

    def _targets(self, node: ast.AST) -> Iterator[str]:
        """The modules of ours an import statement loads (parent packages included)."""
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = self.name if self.is_package else self.name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            names = [base]
            names += [f"{base}.{alias.name}" for alias in node.names
                      if module_file(f"{base}.{alias.name}")]
        for name in names:
            parts = name.split(".")
            for end in range(1, len(parts) + 1):
                if module_file(".".join(parts[:end])):
                    yield ".".join(parts[:end])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_dynamic_import(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__", "reload")


def loaded_at_start(parsed: Dict[str, Imports]) -> Set[str]:
    """Every module of ours imported by the time the daemon serves (and its client is built)."""
    roots = {"multusd", "multusd.__main__"}
    for module, function in START_UP:
        roots |= {target for where, _, target in parse(module, parsed).inside
                  if where == function}
    loaded, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in loaded:
            loaded.add(name)
            todo += parse(name, parsed).top
    return loaded


def parse(name: str, parsed: Dict[str, Imports]) -> Imports:
    if name not in parsed:
        parsed[name] = Imports(name)
    return parsed[name]


def late_imports() -> Tuple[Set[str], List[str]]:
    """The modules loaded at start, and every import the daemon could do later."""
    parsed: Dict[str, Imports] = {}
    loaded = loaded_at_start(parsed)
    # __main__'s other functions are the tools' and check-config's: other processes
    reachable, todo = set(), sorted(loaded - {"multusd.__main__"})
    while todo:
        name = todo.pop()
        if name not in reachable:
            reachable.add(name)
            imports = parse(name, parsed)
            todo += imports.top | {target for _, _, target in imports.inside}
    problems = []
    for name in sorted(reachable):
        imports = parse(name, parsed)
        for function, line, target in imports.inside:
            if (name, function) not in START_UP and target not in loaded:
                problems.append(f"{name}:{line} {function}() imports {target}")
        for function, line in imports.dynamic:
            problems.append(f"{name}:{line} {function or '<module>'}: a dynamic import")
    return loaded, problems


def test_the_daemon_imports_nothing_of_ours_after_start_up():
    loaded, problems = late_imports()
    assert problems == [], (
        "a module of ours would be imported for the first time while the daemon serves: "
        "after an upgrade's unpack that is the new version's file in the old process; import "
        "it at module level (or in serve / the client build):\n  " + "\n  ".join(problems))


def test_start_up_loads_the_request_path():
    """What the check above counts on: the request path, hot-plug and the namespace work."""
    loaded, _ = late_imports()
    assert {"multusd.daemon.lifecycle", "multusd.daemon.server", "multusd.core.multus",
            "multusd.core.hotplug", "multusd.node.netns", "multusd.node.devices",
            "multusd.kube.client", "multusd.daemon.metrics"} <= loaded
    assert not {name for name in loaded if name.startswith("multusd.tools")}
