"""The training engine: one jitted train step and a thin loop (after big_vision `train.py` and flax lm1b
`train.py`), driven by a `Job` — pretraining here (`run`), fine-tuning in `finetune.py`.

The same code runs a laptop smoke test and a TPU pod: the mesh decides how the global batch and the state are
split, each host feeds its slice of the batch, and the step accumulates gradients over micro batches inside one
jitted function, so one optimizer update = one call, and a step checkpoint means the same thing at any scale.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from albert_jax import checkpointing, flops, metrics as metrics_lib, optim, pretrained, sharding
from albert_jax.model import AlbertForPreTraining, dummy_inputs
from albert_jax.model_config import ModelConfig

# Fields that fix the shapes of the parameters: a workdir's saved run must agree on them to resume.
SHAPE_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "num_hidden_groups", "inner_group_num", "max_position_embeddings",
                "type_vocab_size", "sharing", "embedding_projection")


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


# ---------------------------------------------------------------------------------------------------------------
# Losses and steps (pure functions).

def pretraining_totals(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Normalisers over the WHOLE global batch, so accumulated micro-batch gradients equal the full-batch ones."""
  return {"mlm_weight": batch["masked_lm_weights"].astype(jnp.float32).sum() + 1e-5,
          "examples": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}


def pretraining_loss(model: nn.Module, sentence_task: str, params: Any, batch: dict[str, jax.Array],
                     rng: jax.Array, totals: dict[str, jax.Array], deterministic: bool = False):
  """MLM loss Σ(w·nll)/(Σw + 1e-5) plus the SOP/NSP cross-entropy (1:1, as the original). Returns (loss, sums)."""
  out = model.apply({"params": params}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    batch["masked_lm_positions"], deterministic=deterministic, rngs={"dropout": rng})
  ids, weights = batch["masked_lm_ids"], batch["masked_lm_weights"].astype(jnp.float32)
  logits = out["mlm_logits"]
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
  # "The label's logit is the largest" instead of argmax: the max is shared with the softmax, where a separate
  # argmax over V=30000 cost 3% of a small model's CPU step (ties, measure zero, count as correct).
  correct = jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0] >= logits.max(-1)
  sums = {"mlm_loss_sum": (nll * weights).sum(), "mlm_weight": weights.sum(),
          "mlm_correct": (correct * weights).sum()}
  loss = sums["mlm_loss_sum"] / totals["mlm_weight"]
  if sentence_task != "none":
    labels = batch["sentence_order_label"].reshape(-1)
    sop_nll = optax.softmax_cross_entropy_with_integer_labels(out["sop_logits"], labels)
    sums.update(sop_loss_sum=sop_nll.sum(), sop_correct=(out["sop_logits"].argmax(-1) == labels).sum(),
                examples=jnp.asarray(labels.shape[0], jnp.float32))
    loss = loss + sums["sop_loss_sum"] / totals["examples"]
  return loss, sums


def summarize_pretraining(sums: dict[str, float]) -> dict[str, float]:
  """Sums over steps or batches -> the reported losses and accuracies."""
  out = {"mlm_loss": sums["mlm_loss_sum"] / max(sums["mlm_weight"], 1e-5),
         "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_weight"], 1e-5)}
  if "examples" in sums:
    out["sop_loss"] = sums["sop_loss_sum"] / sums["examples"]
    out["sop_accuracy"] = sums["sop_correct"] / sums["examples"]
  out["loss"] = out["mlm_loss"] + out.get("sop_loss", 0.0)
  return out


def make_train_step(loss_fn: Callable, totals_fn: Callable, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, accumulation_steps: int) -> Callable:
  """step(state, batch, rng) -> (state, metrics). loss_fn(params, batch, rng, totals) -> (loss, sums)."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
    rng = jax.random.fold_in(rng, state.step)
    totals = totals_fn(batch)
    if accumulation_steps == 1:
      (loss, sums), grads = grad_fn(state.params, batch, rng, totals)
    else:
      # Row r goes to micro batch r % k: each device keeps its own rows, so no data moves between devices.
      micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // accumulation_steps, accumulation_steps,
                                               *x.shape[1:]).swapaxes(0, 1), batch)

      def accumulate(carry, inputs):
        micro_batch, index = inputs
        out = grad_fn(state.params, micro_batch, jax.random.fold_in(rng, index), totals)
        return jax.tree.map(jnp.add, carry, out), None

      first = jax.tree.map(lambda x: x[0], micro)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                           jax.eval_shape(grad_fn, state.params, first, rng, totals))
      ((loss, sums), grads), _ = jax.lax.scan(accumulate, zeros, (micro, jnp.arange(accumulation_steps)))
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    step_metrics = {**sums, "loss": loss, "grad_norm": optax.global_norm(grads),
                    "learning_rate": schedule(state.step)}
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), step_metrics

  return train_step


def make_eval_step(loss_fn: Callable, totals_fn: Callable) -> Callable:
  def eval_step(params: Any, batch: dict[str, jax.Array]):
    _, sums = loss_fn(params, batch, jax.random.key(0), totals_fn(batch), deterministic=True)
    return sums
  return eval_step


# ---------------------------------------------------------------------------------------------------------------
# Set-up: config checks, batch split, sharded state.

def model_config_from(config: ml_collections.ConfigDict) -> ModelConfig:
  return ModelConfig.from_mapping(config.model.to_dict())


@dataclasses.dataclass(frozen=True)
class BatchSplit:
  global_batch: int
  micro_batch: int           # per data-parallel device and accumulation step
  data_parallel: int
  accumulation_steps: int
  host_batch: int            # rows each process feeds per step


def batch_split(train_config, mesh) -> BatchSplit:
  """global batch = micro batch × data-parallel devices × accumulation steps, checked at start-up."""
  dp = sharding.data_parallel_size(mesh)
  global_batch = int(train_config.global_batch_size)
  if global_batch % jax.process_count():
    raise ValueError(f"train.global_batch_size={global_batch} is not divisible by the {jax.process_count()} "
                     "processes; every host must feed the same number of examples.")
  if global_batch % dp:
    raise ValueError(f"train.global_batch_size={global_batch} is not divisible by the {dp} data-parallel "
                     f"devices; use a multiple of {dp}.")
  micro = int(train_config.micro_batch_size) or global_batch // dp
  if global_batch % (micro * dp):
    raise ValueError(f"train.global_batch_size={global_batch} must equal micro_batch_size={micro} × {dp} "
                     "data-parallel devices × an integer number of accumulation steps; pick a micro batch that "
                     f"divides {global_batch // dp}.")
  return BatchSplit(global_batch, micro, dp, global_batch // (micro * dp), global_batch // jax.process_count())


def check_workdir_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Refuses to resume a workdir whose saved run has a different model shape; writes the resolved config."""
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f).get("model", {})
    diffs = {k: (saved.get(k), config.model.get(k)) for k in SHAPE_FIELDS if saved.get(k) != config.model.get(k)}
    if diffs and checkpointing.Checkpointer(checkpointing.checkpoint_dir(workdir), 1, 1).latest_step() is not None:
      listed = ", ".join(f"model.{k}: saved {a!r} vs now {b!r}" for k, (a, b) in diffs.items())
      raise ValueError(f"Workdir {workdir} holds checkpoints of a different model ({listed}). Use a new --workdir, "
                       "or the saved config (config.json there) to resume.")
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
      f.write(config.to_json_best_effort(indent=2))
    os.replace(path + ".tmp", path)


def strip_boxes(tree: Any) -> Any:
  """Drops the logical-axis boxes without applying their sharding constraints (safe on shape structs)."""
  return jax.tree.map(lambda x: x.value if isinstance(x, nn.Partitioned) else x, tree,
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def abstract_state(init_params: Callable, tx: optax.GradientTransformation) -> TrainState:
  """Shapes of the train state, with the params' logical-axis boxes kept (they give the shardings)."""
  def init(rng):
    params = init_params(rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return jax.eval_shape(init, jax.random.key(0))


def create_state(init_params: Callable, tx: optax.GradientTransformation, rng, state_shardings) -> TrainState:
  """Initialises the state already sharded (never materialised whole on one device)."""
  def init(rng):
    params = nn.unbox(init_params(rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return jax.jit(init, out_shardings=state_shardings)(rng)


def load_init_params(path: str) -> Any:
  """Parameters to warm-start from: a `convert`/`save_pretrained` directory or a training workdir."""
  if pretrained.is_pretrained_dir(path):
    return pretrained.load_pretrained(path)[1]
  ckpt_dir = checkpointing.checkpoint_dir(path)
  if os.path.isdir(ckpt_dir):
    return checkpointing.Checkpointer(ckpt_dir, 1, 1).restore_params()
  raise FileNotFoundError(f"init_checkpoint={path!r} is neither a pretrained-weights directory (model_config.json + "
                          "params/, from `python -m albert_jax.convert`) nor a training workdir (checkpoints/).")


def merge_init_params(target: Any, loaded: Any, required_prefix: str = "albert/") -> tuple[Any, list[str]]:
  """Copies `loaded` into `target` by path. Every parameter under `required_prefix` (the backbone by default;
  "" = all) must be present with the same shape, or this raises naming them; other parameters (heads) are taken
  when present. Returns (params, paths left freshly initialised)."""
  flat_target = flax.traverse_util.flatten_dict(target, sep="/")
  flat_loaded = flax.traverse_util.flatten_dict(loaded, sep="/")
  problems, fresh, merged = [], [], {}
  for path, value in flat_target.items():
    if path in flat_loaded and tuple(flat_loaded[path].shape) == tuple(value.shape):
      merged[path] = jnp.asarray(flat_loaded[path], value.dtype)
      continue
    if path.startswith(required_prefix):
      found = "missing" if path not in flat_loaded else f"shape {tuple(flat_loaded[path].shape)}"
      problems.append(f"{path}: expected shape {tuple(value.shape)}, found {found}")
    fresh.append(path)
    merged[path] = value
  if problems:
    raise ValueError("init_checkpoint does not match the model's backbone:\n  " + "\n  ".join(problems) +
                     "\nCheck --config.model (size, vocab_size, embedding_size) against the checkpoint's "
                     "model_config.json.")
  return flax.traverse_util.unflatten_dict(merged, sep="/"), fresh


# ---------------------------------------------------------------------------------------------------------------
# Data for pretraining.

class SyntheticBatches:
  """Random pretraining batches, a pure function of (seed, step): for smoke tests and benchmarks. The global batch
  is the same whatever the process count; each process takes its own rows."""

  def __init__(self, data_config, host_batch: int, vocab_size: int, seed: int):
    self.config, self.host_batch, self.vocab_size, self.seed = data_config, host_batch, vocab_size, seed
    self.position = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng((self.seed, self.position))
    self.position += 1
    b, s = self.host_batch * jax.process_count(), self.config.max_seq_length
    p = self.config.max_predictions_per_seq or max(1, int(round(s * self.config.masked_lm_prob)))
    positions = np.sort(rng.permuted(np.tile(np.arange(1, s), (b, 1)), axis=1)[:, :p], axis=1)
    batch = {"input_ids": rng.integers(5, self.vocab_size, (b, s), dtype=np.int32),
             "attention_mask": np.ones((b, s), np.int32),
             "token_type_ids": (np.arange(s)[None] >= s // 2).astype(np.int32).repeat(b, 0),
             "masked_lm_positions": positions.astype(np.int32),
             "masked_lm_ids": rng.integers(5, self.vocab_size, (b, p), dtype=np.int32),
             "masked_lm_weights": np.ones((b, p), np.float32),
             "sentence_order_label": rng.integers(0, 2, (b,), dtype=np.int32)}
    rows = slice(jax.process_index() * self.host_batch, (jax.process_index() + 1) * self.host_batch)
    return {k: v[rows] for k, v in batch.items()}

  def get_state(self) -> dict[str, int]:
    return {"position": self.position}

  def set_state(self, state: dict[str, int]) -> None:
    self.position = int(state["position"])


def pretraining_batches(config, split: str, host_batch: int, workdir: str):
  """The iterator named by `data.kind` for `split` ("train" or "eval")."""
  kind = config.data.kind
  if kind == "synthetic":
    return SyntheticBatches(config.data, host_batch, config.model.vocab_size,
                            config.seed + (0 if split == "train" else 1))
  if kind not in ("prepared", "tiny"):
    raise ValueError(f"data.kind={kind!r}; choose 'prepared', 'tiny' or 'synthetic'.")
  from data_pipeline import loader
  data_config = config.data
  if kind == "tiny" and not config.data.path:  # the bundled corpus, built once inside the workdir
    data_config = ml_collections.ConfigDict({**config.data.to_dict(), "path": os.path.join(workdir, "tiny_data")})
  return loader.make_pretraining_iterator(data_config, split=split, global_batch_size=host_batch *
                                          jax.process_count(), seed=config.seed,
                                          vocab_size=config.model.vocab_size)


# ---------------------------------------------------------------------------------------------------------------
# The loop.

class _Preemption:
  """SIGTERM (a TPU VM preemption notice) sets a flag; the loop saves at the next step boundary and exits."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)


def _fetch(device_metrics) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(device_metrics).items()}


def _add(total: dict[str, float], new: dict[str, float]) -> dict[str, float]:
  return {k: total.get(k, 0.0) + v for k, v in new.items()}


@dataclasses.dataclass
class Job:
  """What `fit` trains: everything task-specific, as functions. Pretraining and fine-tuning both build one."""
  init_params: Callable          # rng -> boxed params (logical axis names kept)
  loss_fn: Callable              # (params, batch, rng, totals, deterministic=False) -> (loss, sums)
  totals_fn: Callable            # global batch -> normalisers handed to every micro batch's loss
  summarize: Callable            # summed step metrics -> reported metrics
  batches: Callable              # (split name, host batch) -> iterator with get_state/set_state
  tokens_per_example: int
  flops_per_token: float = 0.0
  evaluate: Callable | None = None   # (step, params, batch_sharding, writer) -> None: scores, writes, keeps best
  warm_start: Callable | None = None  # params (host) -> params; raises if the checkpoint does not fit


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Pretrains from scratch, a warm start, or the workdir's latest checkpoint. Returns the last logged metrics."""
  model_config = model_config_from(config)
  seq_len = config.data.max_seq_length
  if seq_len > model_config.max_position_embeddings:
    raise ValueError(f"data.max_seq_length={seq_len} exceeds model.max_position_embeddings="
                     f"{model_config.max_position_embeddings}.")
  model = AlbertForPreTraining(model_config)
  loss_fn = lambda params, batch, rng, totals, deterministic=False: pretraining_loss(
      model, config.data.sentence_task, params, batch, rng, totals, deterministic)
  eval_fn = jax.jit(make_eval_step(loss_fn, pretraining_totals))
  batches = lambda split, host_batch: pretraining_batches(config, split, host_batch, workdir)
  job = Job(init_params=lambda rng: model.init(rng, **dummy_inputs(1, seq_len))["params"],
            loss_fn=loss_fn, totals_fn=pretraining_totals, summarize=summarize_pretraining, batches=batches,
            tokens_per_example=seq_len,
            flops_per_token=flops.train_flops_per_token(model_config, seq_len, config.data.max_predictions_per_seq),
            evaluate=lambda step, params, batch_sharding, writer: writer.write(
                step, evaluate(config, eval_fn, params, batches, batch_sharding), "eval/"),
            warm_start=(lambda params: merge_init_params(params, load_init_params(config.init_checkpoint)))
            if config.init_checkpoint else None)
  return fit(config, workdir, job)


def fit(config: ml_collections.ConfigDict, workdir: str, job: Job) -> dict[str, float]:
  """The loop: sharded state, resume or init (or warm start), one jitted step, logging, eval, checkpoints,
  preemption and the non-finite guard. Returns the last logged metrics."""
  check_workdir_config(workdir, config)
  mesh = sharding.create_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  split = batch_split(config.train, mesh)
  tx, schedule = optim.create_optimizer(config.train)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = abstract_state(job.init_params, tx)
    state_shardings = sharding.logical_shardings(boxed, mesh, rules)
    batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    ckpt = checkpointing.Checkpointer(checkpointing.checkpoint_dir(workdir), config.checkpoint.every,
                                      config.checkpoint.keep, config.checkpoint.async_save)
    train_iter = job.batches("train", split.host_batch)
    init_rng, rng = jax.random.split(jax.random.key(config.seed))
    rng = jax.device_put(rng, replicated)
    latest = ckpt.latest_step()
    if latest is not None:
      abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                              strip_boxes(boxed), state_shardings)
      state, data_state = ckpt.restore(latest, abstract)
      train_iter.set_state(data_state)
      print(f"Resumed from step {latest} in {ckpt.directory}", flush=True)
    else:
      state = create_state(job.init_params, tx, init_rng, state_shardings)
      if job.warm_start is not None:
        params, fresh = job.warm_start(jax.device_get(state.params))
        state = state.replace(params=jax.device_put(params, state_shardings.params))
        print(f"Warm start from {config.init_checkpoint}; freshly initialised: {fresh or 'none'}", flush=True)

    step_fn = jax.jit(make_train_step(job.loss_fn, job.totals_fn, tx, schedule, split.accumulation_steps),
                      in_shardings=(state_shardings, batch_sharding, replicated),
                      out_shardings=(state_shardings, replicated), donate_argnums=0)
    writer = metrics_lib.MetricWriter(workdir, config.train.num_train_steps)
    peak = flops.peak_flops(jax.devices()[0].device_kind)
    preemption = _Preemption()
    first_step = int(state.step)
    window, window_steps, window_start, last = {}, 0, time.time(), {}
    pending = None   # (step, device metrics): fetched one step late so the host never stalls the device

    def drain():
      nonlocal window, window_steps, pending
      if pending is not None:
        window = _add(window, _checked(pending, ckpt))
        window_steps += 1
        pending = None

    try:
      for step in range(first_step, config.train.num_train_steps):
        if step == config.log.profile_start:
          jax.profiler.start_trace(os.path.join(workdir, "profile"))
        batch = sharding.make_global_batch(next(train_iter), batch_sharding)
        state, step_metrics = step_fn(state, batch, rng)
        drain()
        pending, done = (step + 1, step_metrics), step + 1
        if config.log.profile_start >= 0 and done == config.log.profile_start + config.log.profile_steps:
          jax.profiler.stop_trace()
        stop = preemption.requested or ckpt.reached_preemption(done)
        last_step = done == config.train.num_train_steps
        if done % config.log.every == 0 or last_step or stop:
          drain()
          elapsed = time.time() - window_start
          last = {**job.summarize(window), "grad_norm": window["grad_norm"] / window_steps,
                  "learning_rate": window["learning_rate"] / window_steps,
                  **metrics_lib.throughput(window_steps, elapsed, split.global_batch,
                                           split.global_batch * job.tokens_per_example, job.flops_per_token,
                                           jax.device_count(), peak if job.flops_per_token else None)}
          writer.write(done, last)
          writer.progress(done, last, first_step)
          window, window_steps, window_start = {}, 0, time.time()
        if job.evaluate and config.train.eval_every and (done % config.train.eval_every == 0 or last_step):
          job.evaluate(done, state.params, batch_sharding, writer)
        if done % config.checkpoint.every == 0 or last_step or stop:
          drain()  # never save parameters produced by a non-finite step
          ckpt.save(done, state, train_iter.get_state(), force=True)
        if stop:
          ckpt.wait()
          print(f"Preemption: saved step {done} in {ckpt.directory}; exiting cleanly.", flush=True)
          break
    finally:
      ckpt.wait()
      ckpt.close()
      writer.close()
      preemption.restore()
  return last


def _checked(pending, ckpt: checkpointing.Checkpointer) -> dict[str, float]:
  """Fetches a step's metrics and stops the run on a non-finite loss or gradient norm."""
  step, device_metrics = pending
  values = _fetch(device_metrics)
  if not (np.isfinite(values["loss"]) and np.isfinite(values["grad_norm"])):
    ckpt.wait()
    latest = ckpt.latest_step()
    where = f"step {latest} in {ckpt.directory}" if latest is not None else "none (no checkpoint was saved yet)"
    raise FloatingPointError(f"Loss {values['loss']} / grad norm {values['grad_norm']} at step {step} is not finite. "
                             f"The last good checkpoint is {where}; lower train.learning_rate (or use bf16 with "
                             "float32 params) and restart: the run resumes from it.")
  return values


def evaluate(config, eval_fn, params, batches: Callable, batch_sharding) -> dict[str, float]:
  """MLM/SOP metrics over `train.eval_batches` batches of the held-out documents (the same batches each time)."""
  eval_iter = batches("eval", config.train.global_batch_size // jax.process_count())
  total: dict[str, float] = {}
  for _ in range(config.train.eval_batches):
    total = _add(total, _fetch(eval_fn(params, sharding.make_global_batch(next(eval_iter), batch_sharding))))
  return summarize_pretraining(total)


def run_eval(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """`--mode=eval`: the held-out metrics of the workdir's latest checkpoint."""
  model = AlbertForPreTraining(model_config_from(config))
  mesh = sharding.create_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  batch_split(config.train, mesh)  # the same checks as training
  ckpt = checkpointing.Checkpointer(checkpointing.checkpoint_dir(workdir), 1, 1)
  step = ckpt.latest_step()
  if step is None:
    raise FileNotFoundError(f"No checkpoint in {ckpt.directory}; train first (--mode=train).")
  loss_fn = lambda params, batch, rng, totals, deterministic=True: pretraining_loss(
      model, config.data.sentence_task, params, batch, rng, totals, deterministic)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    params = jax.device_put(ckpt.restore_params(step), sharding.replicated(mesh))
    eval_fn = jax.jit(make_eval_step(loss_fn, pretraining_totals))
    batches = lambda split, host_batch: pretraining_batches(config, split, host_batch, workdir)
    return {"step": step, **evaluate(config, eval_fn, params, batches, sharding.batch_sharding(mesh))}
