"""The import contracts of pyproject.toml's [tool.importlinter] hold
(``lint-imports``): the master does not import the simulator, the layers
sim > master > policies > sched, no ZeroMQ or LMDB under the policies and
the scheduler's core, and comm, store and ps import none of the master,
the workers or the simulator. The master core's components
(``harmony/master/core/``) depend downward only: by their imports (a
contract) and by the methods they call (checked here)."""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = "from importlinter.cli import lint_imports_command as c; c()"


def lint(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-c", LINT, "--no-cache", *args], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    # its report's words, without the colours some releases add (2.6 does)
    r.stdout = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    return r


def test_import_contracts_are_kept():
    r = lint()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and "KEPT" in r.stdout


def test_a_broken_contract_is_caught(tmp_path):
    """The check is not vacuous: the simulator does import the master."""
    cfg = tmp_path / "contracts.toml"
    cfg.write_text('[tool.importlinter]\nroot_package = "harmony"\n\n'
                   '[[tool.importlinter.contracts]]\nname = "inverted"\ntype = "forbidden"\n'
                   'source_modules = ["harmony.sim"]\nforbidden_modules = ["harmony.master"]\n')
    r = lint("--config", str(cfg))
    assert r.returncode != 0 and "inverted BROKEN" in r.stdout, r.stdout + r.stderr


def core_components() -> list[type]:
    """Every class of the master core's package, from its modules."""
    import harmony.master.core as pkg
    out = []
    for mi in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{mi.name}")
        out += [c for _, c in inspect.getmembers(mod, inspect.isclass)
                if c.__module__ == mod.__name__ and hasattr(c, "_send")]
    return out


def calls_up(cls: type, source: str, state: set[str]) -> list[str]:
    """``self.NAME`` in the methods written in ``cls`` (its class body in
    ``source``) that neither ``cls`` nor its bases define and that is not
    an attribute of the state."""
    tree = ast.parse(source)
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    return sorted({f"{cls.__module__}:{n.lineno}: {cls.__name__} uses self.{n.attr}"
                   for n in ast.walk(node)
                   if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                   and n.value.id == "self" and not hasattr(cls, n.attr)
                   and n.attr not in state})


def test_the_master_cores_components_call_only_downward():
    """A component's methods use only what it derives: its own methods, the
    components below it (its bases) and the state (CoreState's attributes).
    A call up (e.g. checkpoints calling the scheduler) would work at run
    time in the composed MasterCore; this keeps it out."""
    from harmony.master.core.master import MasterCore
    from harmony.master.core.state import CoreState
    state = set(vars(CoreState()))
    comps = core_components()
    assert MasterCore in comps and CoreState in comps and len(comps) >= 12
    bad = [b for c in comps
           for b in calls_up(c, Path(inspect.getsourcefile(c)).read_text(), state)]
    assert not bad, "\n".join(bad)


def test_a_call_up_is_caught():
    """The check is not vacuous: the state calling the scheduler fails it."""
    from harmony.master.core import state
    from harmony.master.core.state import CoreState
    src = Path(state.__file__).read_text()
    assert calls_up(CoreState, src, set(vars(CoreState()))) == []
    src = src.replace("    def _jobs_on(self", "    def _up(self):\n        self._schedule()\n\n"
                      "    def _jobs_on(self", 1)
    (bad,) = calls_up(CoreState, src, set(vars(CoreState())))
    assert bad.endswith("CoreState uses self._schedule"), bad


def test_the_cores_import_closure_loads_neither_zmq_nor_lmdb():
    """What the contracts say, checked where it counts: a fresh interpreter
    that imports the master's core, the policies and the scheduler has
    neither zmq nor lmdb loaded (the simulator runs them without sockets)."""
    import subprocess
    import sys
    code = ("import sys, harmony.master.core, harmony.policies.registry, harmony.sched.throughput\n"
            "print(sorted(m for m in ('zmq', 'lmdb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _private_imports_across_packages(root: Path) -> list[str]:
    """``from harmony.A... import _name`` in a module of another package
    than harmony.A (the second part of the dotted name): private names stay
    inside their package."""
    import ast
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = rel.parts
        mine = parts[1] if len(parts) > 2 else parts[-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.startswith("harmony."):
                theirs = node.module.split(".")[1]
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__") \
                            and theirs != mine:
                        out.append(f"{'/'.join(parts)}.py: {node.module}.{alias.name}")
    return out


def test_no_private_names_are_imported_across_packages(tmp_path):
    """The rule (issue #33): a name with a leading underscore is imported only
    within its package. And the check catches one that is not."""
    root = Path(__file__).resolve().parent.parent / "harmony"
    assert _private_imports_across_packages(root) == []
    fake = tmp_path / "harmony"
    (fake / "a").mkdir(parents=True)
    (fake / "b").mkdir()
    (fake / "a" / "x.py").write_text("def _hidden():\n    pass\n")
    (fake / "b" / "y.py").write_text("from harmony.a.x import _hidden\n")
    (fake / "a" / "z.py").write_text("from harmony.a.x import _hidden\n")
    assert _private_imports_across_packages(fake) == ["harmony/b/y.py: harmony.a.x._hidden"]


def executor_state() -> set[str]:
    """The attributes ``Executor.__init__`` sets (the executor's state)."""
    from harmony.worker.executor.process import Executor
    src = Path(inspect.getsourcefile(Executor)).read_text()
    (cls,) = [n for n in ast.parse(src).body
              if isinstance(n, ast.ClassDef) and n.name == "Executor"]
    (init,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    targets = [t for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
    targets += [e for t in targets if isinstance(t, ast.Tuple) for e in t.elts]
    return {t.attr for t in targets if isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name) and t.value.id == "self"}


def test_the_executors_components_call_only_downward():
    """The executor (``harmony/worker/executor/``) is one class composed of
    one mixin per module: a component's methods use only its own methods,
    those of the components below it and the executor's state."""
    import harmony.worker.executor as pkg
    state = executor_state()
    assert {"ctl", "dsock", "client", "server", "sync_gen", "prio"} <= state
    comps = []
    for mi in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{mi.name}")
        comps += [c for _, c in inspect.getmembers(mod, inspect.isclass)
                  if c.__module__ == mod.__name__ and hasattr(c, "send")]
    assert len(comps) == 6, comps
    bad = [b for c in comps
           for b in calls_up(c, Path(inspect.getsourcefile(c)).read_text(), state)]
    assert not bad, "\n".join(bad)
    # and a call up is caught: the links calling the training loop
    from harmony.worker.executor.links import Links
    src = Path(inspect.getsourcefile(Links)).read_text().replace(
        "    def _fail(self", "    def _up(self):\n        self._train()\n\n    def _fail(self", 1)
    (up,) = calls_up(Links, src, state)
    assert up.endswith("Links uses self._train"), up
