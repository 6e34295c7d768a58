"""The task-free training engine: state, batch split, one jitted step and `setup`, the single place that builds
them (after MaxText's `setup_train_loop`). Pretraining (`pretrain.py`) and fine-tuning (`finetune.py`) describe
themselves as a `Job`; the training loop (`loop.fit`), evaluation, prediction, `--mode=compile` and the
benchmarks all call `setup`, so what is compiled for a TPU topology is exactly what training runs.

The same code runs a laptop smoke test and a TPU pod: the mesh decides how the global batch and the state are
split, each host feeds its rows of the batch, and the step accumulates gradients over micro batches inside one
jitted function, so one optimizer update = one call, and a step checkpoint means the same thing at any scale.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from albert_jax import compilation_cache, host_memory, model_config, optim, sharding, trackers
from albert_jax.errors import InputError


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


@dataclasses.dataclass
class Job:
  """What the engine trains, as functions; everything task-specific lives here.

  The normalisation rule, the same for every job: `totals_fn` computes normalisers once over the GLOBAL batch,
  `loss_fn` returns its micro batch's share of the global-batch loss under them plus additive `sums`, and the
  engine adds shares, gradients and sums over micro batches. So k micro batches give exactly the gradient of
  one batch of k times the rows, and `summarize` turns sums added over a window of steps into reported metrics.
  """
  init_params: Callable          # rng -> boxed params (logical axis names kept)
  loss_fn: Callable              # (params, micro batch, rng, totals, deterministic=False) -> (share, sums)
  totals_fn: Callable            # global batch -> normalisers handed to every micro batch's loss
  summarize: Callable            # (sums added over steps, number of steps) -> reported metrics
  batches: Callable              # (split name, BatchSplit) -> host-batch iterator with get_state/set_state
  example_batch: Callable        # rows -> host arrays with the batch's shapes and dtypes
  tokens_per_example: int        # in the longest batches' rows
  tokens_per_row: Callable | None = None  # host batch -> tokens in each of its rows (batches cut to a length)
  flops_per_token: float = 0.0
  evaluate: Callable | None = None   # (step, params, Setup, writer) -> True to stop early: scores, keeps the best
  warm_start: Callable | None = None  # params (host) -> (params, fresh paths); raises if the checkpoint misfits
  inputs: dict = dataclasses.field(default_factory=dict)  # {what: path} of the files that define the run (`provenance`)
  update_factors: Callable | None = None  # params -> a tree of each update's factor, last in the optimizer (`optim`)


@dataclasses.dataclass(frozen=True)
class BatchSplit:
  """How a global batch is cut: global = micro batch × data-parallel devices × accumulation steps, and each of
  the processes feeds `host_batch` consecutive rows of it (`local`)."""
  global_batch: int
  micro_batch: int           # per data-parallel device and accumulation step
  data_parallel: int
  accumulation_steps: int
  process_count: int
  process_index: int

  @property
  def host_batch(self) -> int:
    return self.global_batch // self.process_count

  def local(self, rows: Any) -> Any:
    """This process's rows of anything indexed by global-batch row."""
    return rows[self.process_index * self.host_batch:(self.process_index + 1) * self.host_batch]


def largest_divisor_at_most(n: int, cap: int) -> int:
  return next(d for d in range(min(n, cap), 0, -1) if n % d == 0)


def _batch_size_checks(t) -> list[tuple[bool, str]]:
  """(ok, message) for the batch sizes, which check_training_config and batch_split both refuse."""
  return [
      (t.global_batch_size > 0, f"train.global_batch_size={t.global_batch_size} must be positive"),
      (t.get("max_micro_batch_size", 0) >= 0, f"train.max_micro_batch_size={t.get('max_micro_batch_size')} must "
                                               "be positive (or 0: no cap)"),
      (t.micro_batch_size >= 0, f"train.micro_batch_size={t.micro_batch_size} must be positive (or 0: global "
                                "batch / data-parallel devices)"),
  ]


def _refuse(checks: list[tuple[bool, str]]) -> None:
  """One line naming every (ok, message) check that failed and the fix."""
  problems = [message for ok, message in checks if not ok]
  if problems:
    raise InputError("; ".join(problems) + ". Fix the value(s) with --config.<field>=...")


def batch_split(train_config, mesh, process_count: int | None = None, process_index: int | None = None
                ) -> BatchSplit:
  """Checks at start-up that the global batch divides over processes, devices and micro batches."""
  process_count = jax.process_count() if process_count is None else process_count
  process_index = jax.process_index() if process_index is None else process_index
  _refuse(_batch_size_checks(train_config))  # eval, predict and embed do not run check_training_config
  dp = sharding.data_parallel_size(mesh)
  global_batch = int(train_config.global_batch_size)
  if global_batch % process_count:
    raise InputError(f"train.global_batch_size={global_batch} is not divisible by the {process_count} "
                     "processes; every host must feed the same number of examples.")
  if global_batch % dp:
    raise InputError(f"train.global_batch_size={global_batch} is not divisible by the {dp} data-parallel "
                     f"devices; use a multiple of {dp}.")
  micro = int(train_config.micro_batch_size) or largest_divisor_at_most(
      global_batch // dp, int(train_config.get("max_micro_batch_size", 0)) or global_batch // dp)
  if global_batch % (micro * dp):
    raise InputError(f"train.global_batch_size={global_batch} must equal micro_batch_size={micro} × {dp} "
                     "data-parallel devices × an integer number of accumulation steps; pick a micro batch that "
                     f"divides {global_batch // dp}.")
  return BatchSplit(global_batch, micro, dp, global_batch // (micro * dp), process_count, process_index)


def check_training_config(config: ml_collections.ConfigDict) -> None:
  """Refuses, by field name, values that would crash later, train silently wrong or lose checkpoints; warns of a
  warmup longer than the run. Every mode that trains asks it before it writes anything (`loop.fit` does not)."""
  t, c, log = config.train, config.checkpoint, config.log
  checks = [
      *_batch_size_checks(t),
      host_memory.batch_fits(t.global_batch_size, config.data.max_seq_length),
      (t.num_train_steps > 0, f"train.num_train_steps={t.num_train_steps} must be positive"),
      *((t[name] <= model_config.INT32_MAX, f"train.{name}={t[name]} exceeds {model_config.INT32_MAX:,}, the most "
                                            "the int32 step counter holds")
        for name in ("num_train_steps", "warmup_steps")),
      (0 <= config.seed <= 2**32 - 1, f"seed={config.seed} must be from 0 to {2**32 - 1:,}: jax.random.key keeps 32 "
                                      "bits (seed 2**32 would repeat seed 0) and numpy takes no negative seed"),
      (optim.learning_rate_problem(t.learning_rate) is None,
       f"train.learning_rate={optim.learning_rate_problem(t.learning_rate)}; give a positive rate such as 1e-4"),
      (t.warmup_steps >= 0, f"train.warmup_steps={t.warmup_steps} must be 0 or positive"),
      (t.eval_every >= 0, f"train.eval_every={t.eval_every} must be 0 (never) or positive"),
      (c.every > 0, f"checkpoint.every={c.every} must be positive (steps between checkpoints)"),
      (c.keep > 0, f"checkpoint.keep={c.keep} would keep no checkpoint, so nothing could resume; keep at least 1"),
      (log.every > 0, f"log.every={log.every} must be positive (steps between log lines)"),
  ]
  _refuse(checks)
  trackers.check_trackers(log)
  if t.warmup_steps > t.num_train_steps and jax.process_index() == 0:  # legitimate in smoke tests, so a warning
    print(f"WARNING: train.warmup_steps={t.warmup_steps} > train.num_train_steps={t.num_train_steps}: the learning "
          f"rate never reaches train.learning_rate={t.learning_rate}.", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Steps (pure functions).

def make_train_step(loss_fn: Callable, totals_fn: Callable, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, accumulation_steps: int,
                    mesh: jax.sharding.Mesh | None = None) -> Callable:
  """step(state, batch, rng) -> (state, {"sums", "loss", "grad_norm", "learning_rate"}); see `Job`.

  With accumulation on a `mesh` whose data axis has several devices, each device sums its own rows' gradients over
  the micro steps and the data axis reduces them once per step (`_summed_once_over_data`). Left to the partitioner,
  the gradients were all-reduced at every micro step: 8 times the traffic at 8 micro steps."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def accumulate(params: Any, batch: dict[str, jax.Array], rng: jax.Array, totals: Any,
                 manual_axes: tuple[str, ...] = ()):
    """((loss, sums), grads) summed over the micro batches of `batch` (inside shard_map: over `manual_axes`)."""
    # Row r goes to micro batch r % k: each device keeps its own rows, so no data moves between devices.
    micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // accumulation_steps, accumulation_steps,
                                             *x.shape[1:]).swapaxes(0, 1), batch)

    def add_micro_step(carry, inputs):
      micro_batch, index = inputs
      out = grad_fn(params, micro_batch, jax.random.fold_in(rng, index), totals)
      return jax.tree.map(jnp.add, carry, out), None

    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(lambda s: jax.lax.pcast(jnp.zeros(s.shape, s.dtype), manual_axes, to="varying"),
                         jax.eval_shape(grad_fn, params, first, rng, totals))  # typed like the sums they carry
    return jax.lax.scan(add_micro_step, zeros, (micro, jnp.arange(accumulation_steps)))[0]

  if accumulation_steps > 1 and mesh is not None and _reduces_once(mesh):
    accumulate = _summed_once_over_data(accumulate, mesh)

  def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
    rng = jax.random.fold_in(rng, state.step)
    totals = totals_fn(batch)
    if accumulation_steps == 1:
      (loss, sums), grads = grad_fn(state.params, batch, rng, totals)
    else:
      (loss, sums), grads = accumulate(state.params, batch, rng, totals)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    step_metrics = {"sums": sums, "loss": loss, "grad_norm": optax.global_norm(grads),
                    "learning_rate": schedule(state.step)}
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), step_metrics

  return train_step


def _summed_once_over_data(fn: Callable, mesh: jax.sharding.Mesh) -> Callable:
  """fn(params, batch, rng, totals, manual_axes) run by each data-axis shard on its own rows, and the results summed
  over the data axis once. The other mesh axes (fsdp, tensor) stay with the partitioner. Each shard folds its index
  into the dropout key, so dropout masks (not the loss without dropout) depend on the data axis's size."""
  def per_shard(params, batch, rng, totals):
    rules = tuple((name, _without(axes, "data")) for name, axes in nn.get_logical_axis_rules())
    with nn.logical_axis_rules(rules):  # inside, the data axis is manual: activations name only the others
      # Parameters typed "varying" have per-shard gradients; invariant ones would be all-reduced at every use.
      params = jax.lax.pcast(params, ("data",), to="varying")
      out = fn(params, batch, jax.random.fold_in(rng, jax.lax.axis_index("data")), totals, ("data",))
    return jax.lax.psum(out, "data")

  return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P("data"), P(), P()), out_specs=P(),
                       axis_names={"data"})


def _reduces_once(mesh: jax.sharding.Mesh) -> bool:
  """Whether `_summed_once_over_data` applies: a data axis to reduce over, on a mesh XLA can partition that way.
  XLA's CPU partitioner (jaxlib 0.10.2) aborts the process ("Check failed: partition_group_list...") on a region
  manual over data while fsdp and tensor both split; the TPU compiler compiles it. GPUs, which share the CPU's
  partitioner (not checked on one), keep the partitioner's accumulation there too."""
  two_auto_axes = mesh.shape["fsdp"] > 1 and mesh.shape["tensor"] > 1
  return mesh.shape["data"] > 1 and (not two_auto_axes or mesh.devices.flat[0].platform == "tpu")


def _without(axes: Any, axis: str) -> Any:
  if isinstance(axes, (tuple, list)):
    kept = tuple(a for a in axes if a != axis)
    return kept if len(kept) > 1 else (kept[0] if kept else None)
  return None if axes == axis else axes


def make_eval_step(loss_fn: Callable, totals_fn: Callable) -> Callable:
  """eval_step(params, batch) -> sums, deterministic (no dropout)."""
  def eval_step(params: Any, batch: dict[str, jax.Array]):
    _, sums = loss_fn(params, batch, jax.random.key(0), totals_fn(batch), deterministic=True)
    return sums
  return eval_step


def strip_boxes(tree: Any) -> Any:
  """Drops the logical-axis boxes without applying their sharding constraints (safe on shape structs)."""
  return jax.tree.map(lambda x: x.value if isinstance(x, nn.Partitioned) else x, tree,
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def _abstract(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree, shardings)


# ---------------------------------------------------------------------------------------------------------------
# Set-up: the one place that builds a mesh, a batch split, shardings and the jitted steps.

@dataclasses.dataclass
class Setup:
  """Everything a mode needs to run or compile a job on a mesh. Nothing here is compiled or allocated yet."""
  job: Job
  mesh: jax.sharding.Mesh
  rules: tuple
  split: BatchSplit
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract_state: TrainState    # ShapeDtypeStructs carrying the state's shardings
  state_shardings: TrainState
  batch_sharding: jax.sharding.NamedSharding
  replicated: jax.sharding.NamedSharding
  train_step: Callable          # jitted, state donated
  eval_step: Callable           # jitted
  compiled_steps: dict = dataclasses.field(default_factory=dict, init=False, repr=False)  # `step_for`'s, by shape

  @contextlib.contextmanager
  def context(self) -> Iterator[None]:
    """The mesh and the logical-axis rules, active together."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def replicate(self, params: Any) -> Any:
    """Loaded weights onto every device of the mesh, from host arrays: a restore is committed to this host's first
    device, and putting committed arrays onto other hosts' devices is a cross-host transfer that CPU and GPU
    backends refuse; from host (numpy) arrays every process places its own copy."""
    return jax.device_put(jax.device_get(params), self.replicated)

  def abstract_batch(self, example: dict[str, Any] | None = None) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch as shapes with its sharding: a global batch of rows shaped like `example`'s (any number
    of rows; default: the job's `example_batch`, its longest shape). What the train step is lowered with."""
    example = self.job.example_batch(1) if example is None else example
    return {k: jax.ShapeDtypeStruct((self.split.global_batch, *v.shape[1:]), v.dtype, sharding=self.batch_sharding)
            for k, v in example.items()}

  def abstract_rng(self) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((), jax.eval_shape(jax.random.key, 0).dtype, sharding=self.replicated)

  def lower_train_step(self, example: dict[str, Any] | None = None):
    """The train step lowered from shapes only (a batch shaped like `example`, see `abstract_batch`): nothing is
    allocated, any device kind (TPU topologies too)."""
    return self._lower(self.abstract_batch(example))

  def _lower(self, batch: dict[str, jax.ShapeDtypeStruct]):
    with self.context():
      return self.train_step.lower(self.abstract_state, batch, self.abstract_rng())

  def compile_train_step(self, example: dict[str, Any] | None = None) -> Callable:
    """The train step compiled ahead of time for batches shaped like `example` (default: the job's longest),
    saying on the console for how many devices and how long it took (a start that hits the persistent compilation
    cache shows it); refused when its compiled program does not fit this host's memory (`host_memory`)."""
    hits_before = compilation_cache.hits()
    log = print if jax.process_index() == 0 else lambda *a, **k: None
    devices = f"{self.mesh.size} device{'s' if self.mesh.size > 1 else ''}"
    batch = self.abstract_batch(example)
    shapes = {k: v.shape for k, v in batch.items()}
    longest = {k: v.shape for k, v in self.abstract_batch().items()}
    shape = "" if shapes == longest else f"; inputs {'x'.join(map(str, max(shapes.values(), key=len)))}"
    log(f"Compiling the train step for {devices} (micro batch {self.split.micro_batch} x "
        f"{self.split.accumulation_steps} accumulation step(s){shape})...", flush=True)
    start = time.perf_counter()
    compiled = self._lower(batch).compile()
    log(f"Compiled the train step in {time.perf_counter() - start:.1f} s"
        f"{' (from the compilation cache)' if compilation_cache.hits() > hits_before else ''}.", flush=True)
    host_memory.check_compiled(compiled, self.split, self.abstract_state, batch, self.mesh)
    return compiled

  def step_for(self, host_batch: dict[str, np.ndarray]) -> Callable:
    """The train step for batches shaped like `host_batch` (any number of rows), compiled on first use: once for
    each batch shape the data yields (one per length bucket of fine-tuning; one in all for pretraining)."""
    shape = tuple((name, array.shape[1:], array.dtype) for name, array in sorted(host_batch.items()))
    if shape not in self.compiled_steps:
      self.compiled_steps[shape] = self.compile_train_step(host_batch)
    return self.compiled_steps[shape]

  def run_train_step(self, state: TrainState, host_batch: dict[str, np.ndarray], rng: jax.Array):
    """One step on this host's rows `host_batch`, by the step compiled for their shape (`step_for`)."""
    return self.step_for(host_batch)(state, self.global_batch(host_batch), rng)

  def create_state(self, rng: jax.Array) -> TrainState:
    """Initialises the state already sharded (never materialised whole on one device)."""
    def init(rng):
      params = nn.unbox(self.job.init_params(rng))
      return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params))
    with self.context():
      return jax.jit(init, out_shardings=self.state_shardings)(rng)

  def global_batch(self, host_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    return sharding.make_global_batch(host_batch, self.batch_sharding)


def setup(config: ml_collections.ConfigDict, job: Job, devices: Sequence[jax.Device] | None = None,
          process_count: int | None = None, process_index: int | None = None) -> Setup:
  """Mesh, rules, batch split, optimizer, shardings and jitted steps.

  `devices` defaults to every device of every process; `--mode=compile` passes a TPU topology's devices and the
  process count of that slice instead."""
  mesh = sharding.create_mesh(config.mesh, devices)
  rules = sharding.logical_rules(config.mesh)
  batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  split = batch_split(config.train, mesh, process_count, process_index)
  tx, schedule = optim.create_optimizer(config.train, config.model, job.update_factors)
  key = jax.random.key(0)  # outside the mesh context: keys cannot be made on a compile-only topology's devices

  def init_state(rng):
    params = job.init_params(rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(init_state, key)
  state_shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract_state = _abstract(strip_boxes(boxed), state_shardings)
  if devices is None:  # this host runs it (not a compile for a TPU slice)
    host_memory.check_run(config, split, job.example_batch(1), job.tokens_per_example, abstract_state, mesh)
  train_step = jax.jit(make_train_step(job.loss_fn, job.totals_fn, tx, schedule, split.accumulation_steps, mesh),
                       in_shardings=(state_shardings, batch_sharding, replicated),
                       out_shardings=(state_shardings, replicated), donate_argnums=0)
  return Setup(job=job, mesh=mesh, rules=rules, split=split, tx=tx, schedule=schedule,
               abstract_state=abstract_state, state_shardings=state_shardings,
               batch_sharding=batch_sharding, replicated=replicated, train_step=train_step,
               eval_step=jax.jit(make_eval_step(job.loss_fn, job.totals_fn)))
