"""`python -m bench.step_parts`: where the train step's time goes, by timing its parts as programs of their own,
interleaved: the whole step (optimizer included), the model's loss forward and forward + backward, the optimizer's
update alone, the encoder's forward and forward + backward, and one layer's, attention block's and feed-forward
block's, each against its matmul FLOPs and the same-run `jnp.dot` rate. A thunk trace cannot give this on CPU:
concurrent thunks overlap, so per-op durations do not add up (docs/profiling.md). Backward / forward should be about
2 (twice the matmul FLOPs); the optimizer and the heads are what the step has beyond the model's and the encoder's
forward + backward. The optimizer alone can take longer than that difference: in the step it overlaps the backward.

One more part, "step's matmuls": every `dot_general` of the traced train step (each scanned layer's as many times
as the scan runs), each run alone on random operands of its shapes, one after the other. That is the roof the
step's own shapes allow: the step can at best take as long as its matmuls do, and the `jnp.dot` rate of one square
product overstates what small or batched products reach. The table after it gives each product form's rate.

  python -m bench.step_parts --size tiny256 --seq-len 128 --micro-batch 8 --scan-unroll 0
"""
from __future__ import annotations

import collections
import math
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.extend import core as jax_core

from albert_jax import flops, pretrain
from albert_jax.model import AlbertForPreTraining, AlbertModel, FeedForward, SelfAttention, TransformerLayer
from albert_jax.model_config import model_config_from
from bench import common

MODULE = "bench.step_parts"


class Part:
  """One jitted function of fixed arguments, timed as a runner of `common.measure` (FLOPs: its matmuls')."""

  def __init__(self, name: str, fn: Callable, args: tuple, flops_per_step: float, donate_argnums: tuple = ()):
    self.name, self.flops_per_step, self.compile_s = name, flops_per_step, 0.0
    self._fn, self._args = jax.jit(fn, donate_argnums=donate_argnums), args

  def step(self) -> None:
    jax.block_until_ready(self._fn(*self._args))

  def memory(self) -> dict[str, Any]:
    return {}


def forward_and_backward(name: str, forward: Callable, params: Any, x: Any, flops_forward: float) -> list[Part]:
  """The forward alone, and forward + backward to the parameters and the input (3x the forward's matmuls)."""
  loss = lambda p, x: jnp.sum(forward(p, x).astype(jnp.float32))
  return [Part(f"{name} forward", forward, (params, x), flops_forward),
          Part(f"{name} fwd+bwd", jax.grad(loss, argnums=(0, 1)), (params, x), 3 * flops_forward)]


# A dot_general as the step writes it: operand shapes and dtypes, the dimension numbers, the output dtype asked for.
DotForm = collections.namedtuple("DotForm", "lhs_shape rhs_shape lhs_dtype rhs_dtype dimension_numbers "
                                 "preferred_element_type")


def dot_flops(form: DotForm) -> int:
  """2 x (every lhs dimension) x (the rhs dimensions that are neither contracted nor batch)."""
  (_, rhs_contracting), (_, rhs_batch) = form.dimension_numbers
  free = [d for i, d in enumerate(form.rhs_shape) if i not in rhs_contracting and i not in rhs_batch]
  return 2 * math.prod(form.lhs_shape) * math.prod(free)


def jaxpr_matmuls(jaxpr: jax_core.Jaxpr, times: int = 1,
                  counts: collections.Counter | None = None) -> collections.Counter:
  """DotForm -> how many times one run of `jaxpr` executes it: sub-jaxprs are walked, a scan's body counted
  `length` times. A loop of unknown trip count (`while`) around a matmul is refused rather than guessed."""
  counts = collections.Counter() if counts is None else counts
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      lhs, rhs = (v.aval for v in eqn.invars)
      preferred = eqn.params.get("preferred_element_type")
      counts[DotForm(lhs.shape, rhs.shape, str(lhs.dtype), str(rhs.dtype), eqn.params["dimension_numbers"],
                     None if preferred is None else str(preferred))] += times
    inner = times * eqn.params["length"] if eqn.primitive.name == "scan" else times
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        sub = sub.jaxpr if isinstance(sub, jax_core.ClosedJaxpr) else sub
        if isinstance(sub, jax_core.Jaxpr):
          if eqn.primitive.name in ("while", "cond") and jaxpr_matmuls(sub):
            raise ValueError(f"a matmul inside `{eqn.primitive.name}`: how often it runs is not known statically")
          jaxpr_matmuls(sub, inner, counts)
  return counts


class StepMatmuls:
  """Every matmul of the train step, each run alone (blocking, so one at a time gets the whole machine) as often as
  the step runs it. Also times each form, for the per-form table, and as many calls of a jitted no-op: the
  dispatch each call pays, which `net_of_dispatch_s` takes out."""

  def __init__(self, counts: collections.Counter, name: str = "step's matmuls"):
    self.name, self.compile_s = name, 0.0
    self.calls = sum(counts.values())
    self._noop, self._noop_operand = jax.jit(lambda x: x + 1), jnp.zeros((), jnp.int32)
    self.dispatch_times: list[float] = []
    self.forms = []
    for i, (form, count) in enumerate(counts.items()):
      lhs_key, rhs_key = jax.random.split(jax.random.key(i))
      operands = (jax.random.normal(lhs_key, form.lhs_shape, form.lhs_dtype),
                  jax.random.normal(rhs_key, form.rhs_shape, form.rhs_dtype))
      product = jax.jit(lambda a, b, form=form: jax.lax.dot_general(
          a, b, form.dimension_numbers, preferred_element_type=form.preferred_element_type))
      self.forms.append((form, count, product, operands, []))
    self.flops_per_step = sum(dot_flops(form) * count for form, count, *_ in self.forms)

  def step(self) -> None:
    for _, count, product, operands, times in self.forms:
      start = time.perf_counter()
      for _ in range(count):
        product(*operands).block_until_ready()
      times.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(self.calls):
      self._noop(self._noop_operand).block_until_ready()
    self.dispatch_times.append(time.perf_counter() - start)

  def memory(self) -> dict[str, Any]:
    return {}

  def dispatch_s_per_call(self) -> float:
    return float(np.median(self.dispatch_times)) / self.calls

  def net_of_dispatch_s(self, median_s: float) -> float:
    """The matmuls' own time: the measured median less one no-op dispatch per call."""
    return median_s - self.calls * self.dispatch_s_per_call()

  def form_rows(self) -> list[dict[str, Any]]:
    """Per form, slowest first: calls per step, median ms per step (all its calls), GFLOP/s."""
    rows = []
    for form, count, _, _, times in self.forms:
      median = float(np.median(times))
      rows.append({"lhs": str(form.lhs_shape), "rhs": str(form.rhs_shape), "dtype": form.lhs_dtype,
                   "dimension_numbers": str(form.dimension_numbers), "calls": count, "median_ms": median * 1e3,
                   "gflops_per_s": dot_flops(form) * count / median / 1e9})
    return sorted(rows, key=lambda row: -row["median_ms"])


class OptimizerUpdate(Part):
  """The step's optimizer alone (`train.optimizer`, clipping included), applied to fixed gradients of the
  parameters' shapes, its parameters and state donated and carried from call to call as the step does: what the
  step spends beyond the model's forward + backward when nothing else runs beside it."""

  def __init__(self, tx: optax.GradientTransformation, state: Any):
    params = jax.tree.map(jnp.array, nn.unbox(state.params))   # copies: the step's own state stays its own
    grads = jax.tree.map(lambda p: 1e-3 * jax.random.normal(jax.random.key(3), p.shape, p.dtype), params)

    def update(params, opt_state, grads):
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state
    super().__init__("optimizer update", update, (params, jax.tree.map(jnp.array, state.opt_state), grads), 0.0,
                     donate_argnums=(0, 1))

  def step(self) -> None:
    params, opt_state, grads = self._args
    self._args = (*jax.block_until_ready(self._fn(params, opt_state, grads)), grads)


def parts(config) -> list[Any]:
  c = model_config_from(config)
  ours = common.Ours(config, "train step")
  batch = jax.tree.map(jnp.array, ours.batches[0])        # copies: the step donates its state, not these
  params = jax.tree.map(jnp.array, nn.unbox(ours.state.params))
  tokens, seq, h, i = ours.tokens_per_step, config.data.max_seq_length, c.hidden_size, c.intermediate_size
  model, totals = AlbertForPreTraining(c), pretrain.pretraining_totals(batch)
  loss = lambda p, _: pretrain.pretraining_loss(model, config.data.sentence_task, p, batch, jax.random.key(0),
                                                totals, deterministic=True)[0]
  model_forward = tokens * flops.train_flops_per_token(c, seq, pretrain.prediction_slots(config.data)) / 3
  setup = ours.setup
  with setup.context():
    traced = setup.train_step.trace(setup.abstract_state, setup.abstract_batch(), setup.abstract_rng())
  out = [ours, StepMatmuls(jaxpr_matmuls(traced.jaxpr.jaxpr)),
         *forward_and_backward("model", loss, params, 0.0, model_forward), OptimizerUpdate(setup.tx, ours.state)]
  encoder = lambda p, _: AlbertModel(c).apply({"params": p}, batch["input_ids"], batch["attention_mask"],
                                              batch["token_type_ids"])[0]
  layer_flops = {"attention": tokens * (8 * h * h + 4 * seq * h), "ffn": tokens * 4 * h * i}
  layer_flops["layer"] = sum(layer_flops.values())
  projection = 2 * tokens * c.embedding_size * h if c.has_embedding_projection else 0
  out += forward_and_backward("encoder", encoder, params["albert"], 0.0,
                              c.num_hidden_layers * c.inner_group_num * layer_flops["layer"] + projection)
  x = jax.random.normal(jax.random.key(1), (batch["input_ids"].shape[0], seq, h), jnp.dtype(c.dtype))
  mask = batch["attention_mask"][:, None, None, :].astype(bool)
  for name, module, extra in (("layer", TransformerLayer(c), (mask,)), ("attention", SelfAttention(c), (mask,)),
                              ("ffn", FeedForward(c), ())):
    block_params = nn.unbox(module.init(jax.random.key(2), x, *extra, True)["params"])
    apply = lambda p, x, module=module, extra=extra: module.apply({"params": p}, x, *extra, True)
    out += forward_and_backward(name, apply, block_params, x, layer_flops[name])
  return out


def main(argv=None) -> dict:
  p = common.parser(__doc__)
  args = p.parse_args(argv)
  config = common.bench_config(args)
  print(common.describe(config), flush=True)
  runners = parts(config) + [common.Matmul(args.matmul_size, "jax")]
  rows, _, _ = common.measure(runners, args)
  by_name = {r["name"]: r for r in rows}
  rate = by_name["matmul_jax"]["tflops_per_s"]
  for row in rows:
    row["median_ms"] = row["median_s"] * 1e3
    row["fraction_of_matmul"] = row["tflops_per_s"] / rate if row["name"] != "matmul_jax" and row[
        "tflops_per_s"] else None
  common.print_table(rows, (("part", "name", ""), ("median ms", "median_ms", ".1f"), ("TFLOP/s", "tflops_per_s", ".3f"),
                            ("of jnp.dot", "fraction_of_matmul", ".1%")),
                     f"the step's parts, {args.steps} timed calls each, interleaved")
  median = lambda name: by_name[name]["median_s"]
  derived = {f"{part} backward/forward": (median(f"{part} fwd+bwd") - median(f"{part} forward")) / median(
      f"{part} forward") for part in ("model", "encoder", "layer", "attention", "ffn")}
  matmuls = next(r for r in runners if isinstance(r, StepMatmuls))
  common.print_table(matmuls.form_rows(), (("lhs", "lhs", ""), ("rhs", "rhs", ""), ("dimension numbers",
                     "dimension_numbers", ""), ("calls", "calls", "d"), ("ms", "median_ms", ".1f"),
                     ("GFLOP/s", "gflops_per_s", ".1f")), "the step's matmul forms, each alone")
  net = matmuls.net_of_dispatch_s(median("step's matmuls"))
  derived["step's matmuls alone, share of the step"] = median("step's matmuls") / median("train step")
  derived["step's matmuls net of dispatch, share of the step"] = net / median("train step")
  derived["step's matmuls net of dispatch, of jnp.dot"] = matmuls.flops_per_step / net / 1e12 / rate
  derived["dispatch per product call, ms"] = matmuls.dispatch_s_per_call() * 1e3
  derived["optimizer share of the step"] = (median("train step") - median("model fwd+bwd")) / median("train step")
  derived["optimizer update alone, share of the step"] = median("optimizer update") / median("train step")
  derived["heads and embeddings share of the step"] = (median("model fwd+bwd") - median("encoder fwd+bwd")) / median(
      "train step")
  for key, value in derived.items():
    print(f"{key}: {value:.3f}", flush=True)
  payload = {"config": common.describe(config), "model": config.model.to_dict(), "seq_len": args.seq_len,
             "micro_batch": args.micro_batch, "rows": rows, "derived": derived, "matmul_forms": matmuls.form_rows(),
             "notes": ["FLOPs are the matmuls' (2mkn); fwd+bwd = 3x forward",
                       "the layer, attention and ffn parts run on a random input of the model's width",
                       "step's matmuls: every dot_general of the traced step, each run alone, one at a time; "
                       "net of dispatch: less the time of as many calls of a jitted no-op"]}
  common.write_json(args, "step_parts", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
