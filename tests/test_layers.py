"""The packages' structure: layers that import only downwards, no import cycle, no oversized module, and a library
that changes nothing process-wide when imported (the command lines set the process up, `albert_jax.console`)."""
import ast
import pathlib
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

PACKAGES = ("albert_jax", "data_pipeline", "experiments", "bench")

# Bottom to top; a module may import its own layer and the layers below it. A module belongs to the layer of its
# longest prefix listed here, so a package may span layers by listing some of its modules higher (`albert_jax.run`).
LAYERS = {
    "errors and storage": ("albert_jax.errors", "albert_jax.storage"),
    "data": ("data_pipeline",),
    "the run's folder": ("albert_jax.run",),
    "model and engine": ("albert_jax.ops", "albert_jax.model_config", "albert_jax.model", "albert_jax.flops",
                         "albert_jax.optim", "albert_jax.sharding", "albert_jax.topology", "albert_jax.hlo_text",
                         "albert_jax.compile_stats", "albert_jax.step_bound", "albert_jax.host_memory",
                         "albert_jax.data_states", "albert_jax.checkpointing", "albert_jax.compilation_cache",
                         "albert_jax.trackers", "albert_jax.metrics", "albert_jax.engine", "albert_jax.run.config",
                         "albert_jax.stop_signals", "albert_jax.loop"),
    "tasks and weights": ("albert_jax.families", "albert_jax.tasks", "albert_jax.buckets",
                          "albert_jax.feature_batches", "albert_jax.head_identity", "albert_jax.run.best_keeper",
                          "albert_jax.weights", "albert_jax.formats"),
    "process set-up": ("albert_jax.console",),
    "jobs": ("albert_jax.pretrain", "albert_jax.families.electra_pretraining", "albert_jax.finetune",
             "albert_jax.embed", "albert_jax.describe", "albert_jax.evaluate", "albert_jax.glue_submission",
             "albert_jax.convert", "albert_jax.prediction", "albert_jax.tpu_compile"),
    "job kinds": ("albert_jax.job_kinds",),
    "command line": ("albert_jax.runner", "albert_jax.cli", "albert_jax.main", "albert_jax.seeds",
                     "albert_jax.seeds_report"),
    "experiments": ("experiments",),
    "benchmarks": ("bench",),
}
MAX_MODULE_LINES = 400


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


def _imports(path: pathlib.Path) -> set[str]:
  """The project modules `path` imports, at the top or inside functions."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                   for a in node.names)
  return {name for name in found if name in MODULES}


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def layer_of(module: str) -> int | None:
  """The index of the module's layer, by the longest name in LAYERS that is it or a package holding it (a family's
  objective sits above its package); the package roots (`albert_jax/__init__.py`: a docstring) belong to none."""
  held = [(len(p), index) for index, prefixes in enumerate(LAYERS.values()) for p in prefixes
          if module == p or module.startswith(p + ".")]
  return max(held)[1] if held else None


def test_every_module_has_a_layer():
  unplaced = [m for m in MODULES if layer_of(m) is None and m not in ("albert_jax", "data_pipeline")]
  assert not unplaced, f"add these modules to a layer of LAYERS: {unplaced}"


def test_no_import_runs_up_a_layer():
  upward = [f"{m} ({list(LAYERS)[layer_of(m)]}) imports {d} ({list(LAYERS)[layer_of(d)]})"
            for m, deps in GRAPH.items() for d in deps
            if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) > layer_of(m)]
  assert not upward, "\n".join(upward)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle of `graph` as the path that closes it, or None."""
  state: dict[str, str] = {}
  path: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = "open"
    path.append(node)
    for dep in sorted(graph.get(node, ())):
      if state.get(dep) == "open":
        return path[path.index(dep):] + [dep]
      if dep not in state and (cycle := visit(dep)):
        return cycle
    state[node] = "done"
    path.pop()
    return None

  for node in sorted(graph):
    if node not in state and (cycle := visit(node)):
      return cycle
  return None


def test_no_import_cycle():
  assert find_cycle(GRAPH) is None, " -> ".join(find_cycle(GRAPH))


def test_the_cycle_finder_finds_a_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_layer_check_sees_an_upward_import():
  assert layer_of("albert_jax.engine") < layer_of("albert_jax.pretrain") < layer_of("albert_jax.main")
  assert layer_of("data_pipeline.loader") < layer_of("albert_jax.engine")
  assert "data_pipeline.loader" in GRAPH["albert_jax.pretrain"]  # a real downward import, seen by the walk
  # a package spanning layers: the run's folder below the model, its config's resume checks beside the
  # checkpoints, the keeper of its best checkpoint beside the weights it saves
  assert (layer_of("albert_jax.run") == layer_of("albert_jax.run.layout") == layer_of("albert_jax.run.best")
          < layer_of("albert_jax.run.config") == layer_of("albert_jax.checkpointing")
          < layer_of("albert_jax.run.best_keeper") == layer_of("albert_jax.weights.store"))
  # A module named in LAYERS takes its own layer over its package's: a family's objective sits with the jobs.
  assert layer_of("albert_jax.families.electra") < layer_of("albert_jax.families.electra_pretraining") == layer_of(
      "albert_jax.pretrain")


def test_no_module_of_the_library_is_over_the_size_limit():
  long = {name: n for name, path in MODULES.items() if name.startswith("albert_jax")
          and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
  assert not long, f"split these modules (lines): {long}"


def test_the_engine_knows_no_task():
  """Below it only errors, storage and the run whose checkpoints it opens (`engine.setup`)."""
  assert {layer_of(d) for d in GRAPH["albert_jax.engine"]} <= {
      layer_of("albert_jax.errors"), layer_of("albert_jax.run"), layer_of("albert_jax.engine")}
  assert ".task" not in MODULES["albert_jax.engine"].read_text()


@pytest.mark.parametrize("call, allowed", [
    ("sys.unraisablehook =", {"albert_jax.console"}),
    ("addFilter", {"albert_jax.console"}),
    ("mark_as_parsed", {"albert_jax.console"}),
    ("set_verbosity", {"albert_jax.console"}),
    ("register_event_listener", {"albert_jax.compilation_cache"}),
    # a signal handler that must not wait for threads, and a data-preparation worker whose parent is gone
    ("os._exit", {"albert_jax.stop_signals", "data_pipeline.prepare"}),
])
def test_process_wide_changes_are_made_in_one_place(call, allowed):
  users = {name for name, path in MODULES.items() if call in path.read_text()}
  assert users <= allowed, f"{call} in {sorted(users - allowed)}"


def test_importing_the_library_changes_nothing_process_wide():
  """Every module imported: the unraisable hook, the logging filters and absl's flag state are as Python left
  them; `console.install()` then sets them, once however often it is called."""
  modules = [m for m in MODULES if m.split(".")[0] in ("albert_jax", "data_pipeline")
             and m not in ("albert_jax.main",)]  # main defines its flags on import, as an absl program does
  script = f"""
import logging, sys, importlib
hook, filters = sys.unraisablehook, list(logging.getLogger("absl").filters)
for name in {modules!r}:
  importlib.import_module(name)
from absl import flags
assert sys.unraisablehook is hook and logging.getLogger("absl").filters == filters, "changed at import"
assert not flags.FLAGS.is_parsed()
from albert_jax import console
console.install(); console.install()
assert sys.unraisablehook is not hook and len(logging.getLogger("absl").filters) == len(filters) + 1
assert flags.FLAGS.is_parsed()
print("ok")
"""
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_every_mode_is_a_method_of_the_job_kinds():
  """The modes table holds JobKind methods; a kind has the modes whose methods it overrides."""
  from albert_jax import job_kinds, runner
  assert all(getattr(job_kinds.JobKind, mode.method.__name__) is mode.method for mode in runner.MODES.values())
  has = {kind: [name for name, mode in runner.MODES.items() if kind(None).has(mode.method)]
         for kind in (job_kinds.Pretraining, job_kinds.FineTuning)}
  assert has == {job_kinds.Pretraining: ["train", "eval", "embed", "compile", "describe"],
                 job_kinds.FineTuning: ["train", "eval", "predict", "embed", "compile", "describe"]}


@pytest.mark.parametrize("pattern, owner", [
    (r"join\((self\.)?(workdir|run_dir)\b", "albert_jax.run"),  # a path in a run's folder: `run.Run` names it
    (r"task [!=]= .pretrain.", "albert_jax.job_kinds"),       # the job kind: chosen once, `job_kinds.kind_for`
])
def test_one_module_owns_the_run_s_layout_and_the_choice_of_job_kind(pattern, owner):
  found = [f"{name}:{number}" for name, path in MODULES.items() if name.startswith(("albert_jax", "data_pipeline"))
           and name != owner and not name.startswith(owner + ".")  # a package owns what its modules do
           for number, line in enumerate(path.read_text().splitlines(), 1) if re.search(pattern, line)]
  assert not found, f"{pattern} outside {owner}: {found}"


def test_importing_the_command_line_imports_no_jax():
  """The job kinds import their job modules (jax, flax, orbax: seconds) only when a mode runs: `--help` is fast."""
  script = "import sys; import albert_jax.main; print('jax' in sys.modules)"
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.stdout.strip() == "False", result.stderr[-3000:]
