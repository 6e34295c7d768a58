"""Shared benchmark plumbing, so every script measures the same way (../shared/PERFORMANCE.md §4.3).

- `environment()`: what every JSON records (device kind, versions, CPU model, threads, XLA flags, command line, and
  how busy the machine was: bench/machine.py);
- `bench_config`: a pretraining config from a size (or an experiment file) plus the command-line overrides;
- runners with one blocking `step()` each: `Ours` (the real jitted, donated, sharded train step), `Peer`
  (transformers' PyTorch ALBERT), `Matmul` (the machine's achievable matmul rate);
- `interleave`: alternates blocks of the runners' steps, so a noisy shared machine slows them alike;
- `summarize`, `print_table`, `write_json`; for bench.paper_small's files: `write_json_file`, `write_shared_json`,
  `write_doc_section`.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from albert_jax import console, engine, flops, pretrain, sharding
from albert_jax.model import flat_matmuls, fused_qkv, scan_unroll
from albert_jax.model_config import model_config_from
from bench import machine
from experiments import common as experiments

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# Sizes only the benchmarks use: name -> (the named size it starts from, overrides).
BENCH_SIZES = {
    # The CPU "tiny": H=256, L=4, heads 4, FFN 1024, with ALBERT's E=128 and V=30000 (a real MLM head).
    "tiny256": ("base", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)),
}


# ---------------------------------------------------------------------------------------------------------------
# Environment and command line.

def cpu_threads() -> int:
  """The cores this process may use: XLA's CPU thread pool sizes itself by them; the peer gets as many."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _nvidia_smi() -> str | None:
  """GPU model, driver, clocks and power cap (PERFORMANCE.md §4.3 item 4), when nvidia-smi exists."""
  try:
    return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit,"
                           "memory.total", "--format=csv"], capture_output=True, text=True, timeout=20).stdout
  except (OSError, subprocess.SubprocessError):
    return None


def environment(module: str, matmul_tflops_per_s: float | None = None) -> dict[str, Any]:
  """`machine`: load average and other processes' CPU share at start and end, with the run's matmul rate."""
  device = jax.devices()[0]
  return {"device_kind": device.device_kind, "platform": device.platform, "device_count": jax.device_count(),
          "jax": jax.__version__, "jaxlib": _version("jaxlib"), "flax": _version("flax"), "optax": _version("optax"),
          "torch": _version("torch"), "transformers": _version("transformers"), "python": platform.python_version(),
          "cpu_model": _cpu_model(), "cpu_threads": cpu_threads(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "machine": machine.report(matmul_tflops_per_s),
          "nvidia_smi": _nvidia_smi() if device.platform == "gpu" else None,
          "command": " ".join(["python", "-m", module] + [shlex.quote(a) for a in sys.argv[1:]]),
          "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def parser(doc: str) -> argparse.ArgumentParser:
  """The model/batch/timing flags every script shares; sets the process up as albert_jax.main does
  (`albert_jax.console`)."""
  console.install()
  p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="base", help="a model_config size (base, large, bert_large, tiny, ...) or "
                 f"one of {sorted(BENCH_SIZES)}")
  p.add_argument("--experiment", default="", help="experiment file[:arg] instead of --size, e.g. "
                 "experiments/pretrain_base.py; the flags below still override its data/train/model fields")
  p.add_argument("--seq-len", type=int, default=128)
  p.add_argument("--micro-batch", type=int, default=8, help="examples per device per accumulation step")
  p.add_argument("--accumulation", type=int, default=1, help="micro batches per optimizer step")
  p.add_argument("--predictions", type=int, default=20, help="masked positions per sequence (MLM head rows)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype (params f32)")
  p.add_argument("--remat", default="none", help="model.remat_policy (none, full, dots_saveable, ...)")
  p.add_argument("--optimizer", default="", help="train.optimizer override (lamb, optax_lamb, adamw)")
  p.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (0 = the size's)")
  p.add_argument("--no-scan", action="store_true", help="Python-loop encoder (scan_layers=False)")
  p.add_argument("--scan-unroll", type=int, default=None, help="model.scan_unroll: layers per scan iteration "
                 "(0 = all of them: straight-line code, faster steps on CPU, compile time grows with depth; "
                 "default: the config's, every layer on a GPU and 1 elsewhere unless the experiment sets it)")
  p.add_argument("--flat-matmuls", action="store_true", help="model.flat_matmuls=True: dense layers as 2-D "
                 "products, whose kernel gradients XLA's CPU backend runs faster (already the default on CPU; off "
                 "elsewhere: TPU memory)")
  p.add_argument("--vocab-size", type=int, default=0, help="override vocab_size (0 = the size's)")
  p.add_argument("--steps", type=int, default=50, help="timed steps per runner (>= 50 for reported numbers)")
  p.add_argument("--warmup", type=int, default=5, help="untimed steps per runner after the compiling one")
  p.add_argument("--block", type=int, default=10, help="steps per interleaved block")
  p.add_argument("--matmul-size", type=int, default=2048, help="n of the n×n matmul rate (0: skip it)")
  p.add_argument("--results-dir", default=RESULTS_DIR)
  p.add_argument("--name", default="", help="JSON file name (default: the script's)")
  return p


def load_experiment(spec: str) -> ml_collections.ConfigDict:
  path, _, arg = spec.partition(":")
  loaded = importlib.util.spec_from_file_location("bench_experiment", path)
  module = importlib.util.module_from_spec(loaded)
  loaded.loader.exec_module(module)
  return module.get_config(arg or None)


def bench_config(args: argparse.Namespace, **model_overrides) -> ml_collections.ConfigDict:
  """A pretraining config for one device-batch shape: synthetic data, no eval, the flags applied."""
  if args.experiment:
    c = load_experiment(args.experiment)
  else:
    base, extra = BENCH_SIZES.get(args.size, (args.size, {}))
    c = experiments.pretraining_config(base)
    c.model = experiments.model_config(base, **extra)
    c.model_size = args.size
  c.model.dtype = args.dtype
  c.model.remat_policy = args.remat
  c.model.scan_layers = not args.no_scan
  if args.layers:
    c.model.num_hidden_layers = args.layers
  if args.scan_unroll is not None:
    c.model.scan_unroll = args.scan_unroll or c.model.num_hidden_layers
  if args.flat_matmuls:
    c.model.flat_matmuls = True
  if args.vocab_size:
    c.model.vocab_size = args.vocab_size
  for key, value in model_overrides.items():
    c.model[key] = value
  # As they run on this backend, so the JSON says so.
  c.model.flat_matmuls = flat_matmuls(model_config_from(c))
  c.model.scan_unroll = scan_unroll(model_config_from(c))
  c.model.fused_qkv = fused_qkv(model_config_from(c))
  c.data.kind = "synthetic"
  c.data.max_seq_length = args.seq_len
  c.data.max_predictions_per_seq = args.predictions
  dp = jax.device_count()
  c.train.micro_batch_size = args.micro_batch
  c.train.global_batch_size = args.micro_batch * args.accumulation * dp
  if args.optimizer:
    c.train.optimizer = args.optimizer
  return c


def with_optimizer(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(config.to_dict())
  c.train.optimizer = name
  return c


def describe(config: ml_collections.ConfigDict) -> str:
  m, t = config.model, config.train
  return (f"{config.get('model_size', '?')} (L={m.num_hidden_layers} H={m.hidden_size} I={m.intermediate_size} "
          f"heads={m.num_attention_heads} E={m.embedding_size} V={m.vocab_size}) seq={config.data.max_seq_length} "
          f"M={config.data.max_predictions_per_seq} micro_batch={t.micro_batch_size} "
          f"accumulation={t.global_batch_size // (t.micro_batch_size * jax.device_count())} dtype={m.dtype} "
          f"remat={m.remat_policy} scan={m.scan_layers} unroll={m.scan_unroll} optimizer={t.optimizer}")


# ---------------------------------------------------------------------------------------------------------------
# Runners: each has name, step() (blocking), tokens/examples/FLOPs per step, compile_s, and memory figures.

def build_step(config: ml_collections.ConfigDict) -> engine.Setup:
  """What `loop.fit` runs for one config (the same `engine.setup`), so that both the timed runner and the memory
  probe compile exactly the training loop's step."""
  return engine.setup(config, pretrain.make_job(config))


def compile_step(s: engine.Setup) -> tuple[Any, float, float]:
  """Lowers and compiles the step from shapes only. Returns (compiled, lower seconds, compile seconds)."""
  start = time.perf_counter()
  lowered = s.lower_train_step()
  lowered_at = time.perf_counter()
  with s.context():
    compiled = lowered.compile()
  return compiled, lowered_at - start, time.perf_counter() - lowered_at


def step_memory_bytes(config: ml_collections.ConfigDict) -> int | None:
  """XLA's estimate of the step's resident bytes, from compiling it (nothing is allocated)."""
  return compiled_memory_bytes(compile_step(build_step(config))[0])


class Ours:
  """The real train step, built as `loop.fit` builds it (`engine.setup`): the configured optimizer (LAMB by
  default), the state sharded by the logical rules and donated to one jitted step that accumulates micro batches. Fed device-resident
  synthetic batches unless `step(batch)` gets one. Compile time is measured apart (lower + compile).
  `job` and `host_batches` (two or more) step another job than pretraining's, on its own batches."""

  def __init__(self, config: ml_collections.ConfigDict, name: str = "ours", job: engine.Job | None = None,
               host_batches: Sequence[dict[str, np.ndarray]] = ()):
    self.name, self.config = name, config
    self.setup = s = engine.setup(config, job) if job else build_step(config)
    self.batch_sharding = s.batch_sharding
    synthetic = iter(host_batches) if job else pretrain.SyntheticBatches(config.data, s.split,
                                                                         config.model.vocab_size, config.seed)
    self.host_example = next(synthetic)
    self.examples_per_step = s.split.global_batch
    self.tokens_per_step = s.split.global_batch * s.job.tokens_per_example
    self.flops_per_token = s.job.flops_per_token
    self.compiled, self.lower_s, self.compile_s = compile_step(s)
    self.state = s.create_state(jax.random.key(config.seed))
    self.batches = [self.put(self.host_example), self.put(next(synthetic))]
    self.rng = jax.device_put(jax.random.key(config.seed + 1), s.replicated)
    self.count = 0
    self.first_loss: float | None = None   # same seed, same batch: variants of one function agree on it

  def put(self, host_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Host batch -> global device batch, cast to the dtypes the step was compiled for."""
    return sharding.make_global_batch({k: np.asarray(v, self.host_example[k].dtype) for k, v in host_batch.items()},
                                      self.batch_sharding)

  def step(self, batch: dict[str, jax.Array] | None = None) -> None:
    if batch is None:
      batch = self.batches[self.count % len(self.batches)]
    self.state, metrics = self.compiled(self.state, batch, self.rng)
    jax.block_until_ready((self.state, metrics))
    if self.count == 0:
      self.first_loss = float(metrics["loss"])
    self.count += 1

  def memory(self) -> dict[str, Any]:
    """XLA's static estimate (any backend) and the device allocator's peak (GPU/TPU only)."""
    out: dict[str, Any] = {"compiled_memory_bytes": compiled_memory_bytes(self.compiled),
                           "first_step_loss": self.first_loss}
    stats = jax.devices()[0].memory_stats()
    out["peak_memory_bytes"] = stats.get("peak_bytes_in_use") if stats else None
    try:
      cost = self.compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      out["xla_flops_per_step"] = float(cost.get("flops", 0.0)) or None
    except Exception:  # noqa: BLE001 - not every backend implements it
      out["xla_flops_per_step"] = None
    return out


def compiled_memory_bytes(compiled) -> int | None:
  """arguments + outputs + temporaries - donated aliases: what the step needs resident at its peak."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


class Fed:
  """`Ours`' step fed by a host iterator (the real loader): fetch + transfer + step, as the training loop does."""

  def __init__(self, ours: Ours, host_batches: Iterator[dict[str, np.ndarray]], name: str):
    self.ours, self.host_batches, self.name = ours, host_batches, name
    self.examples_per_step, self.tokens_per_step = ours.examples_per_step, ours.tokens_per_step
    self.flops_per_token, self.compile_s = ours.flops_per_token, 0.0

  def step(self) -> None:
    self.ours.step(self.ours.put(next(self.host_batches)))

  def memory(self) -> dict[str, Any]:
    return {}


def import_torch():
  """torch, imported only by the runners that need it (OMP_WAIT_POLICY: see bench/__init__.py)."""
  import torch
  return torch


class Peer:
  """transformers' `AlbertForPreTraining` (PyTorch) on our config and batch. HF computes MLM logits at every
  position, so its labels are -100 except at our M predicted positions (same loss). Torch has no LAMB: AdamW,
  with our global-norm clip 1.0. CPU: float32 with the same thread count as XLA; GPU: bf16 autocast, sdpa."""

  def __init__(self, config: ml_collections.ConfigDict, name: str = "peer", compile: bool = False,
               threads: int | None = None):
    torch = import_torch()
    import transformers
    from albert_jax.formats import hf_albert
    self.name, self.torch = name, torch
    torch.set_num_threads(threads or cpu_threads())
    self.device = torch.device("cuda" if torch.cuda.is_available() and jax.devices()[0].platform == "gpu" else "cpu")
    model_config = model_config_from(config)
    hf = {k: v for k, v in hf_albert.config_to_hf(model_config).items() if k != "model_type"}
    if hf["hidden_act"] == "gelu_new":
      hf["hidden_act"] = "gelu_pytorch_tanh"   # the same tanh formula as one fused kernel: the stronger peer
    hf_config = transformers.AlbertConfig(**hf)
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(config.seed)
    model = transformers.AlbertForPreTraining(hf_config).to(self.device).train()
    self.parameters = [p for p in model.parameters() if p.requires_grad]
    self.optimizer = torch.optim.AdamW(self.parameters, lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                                       fused=self.device.type == "cuda")
    self.model = torch.compile(model) if compile else model
    self.autocast = self.device.type == "cuda" and model_config.dtype == "bfloat16"
    seq = config.data.max_seq_length
    k = config.train.global_batch_size // (config.train.micro_batch_size * jax.device_count())
    host = pretrain.synthetic_batch(config.data, config.train.global_batch_size, model_config.vocab_size,
                                    (config.seed, 0))  # the first batch `Ours` steps on
    labels = np.full(host["input_ids"].shape, -100, np.int64)
    np.put_along_axis(labels, host["masked_lm_positions"], host["masked_lm_ids"], axis=1)
    full = {"input_ids": host["input_ids"], "attention_mask": host["attention_mask"],
            "token_type_ids": host["token_type_ids"], "labels": labels,
            "sentence_order_label": host["sentence_order_label"]}
    to = lambda x: torch.as_tensor(np.asarray(x, np.int64)).to(self.device)
    self.micro_batches = [{key: to(v[i::k]) for key, v in full.items()} for i in range(k)]
    self.examples_per_step = config.train.global_batch_size
    self.tokens_per_step = self.examples_per_step * seq
    self.flops_per_token = flops.train_flops_per_token(model_config, seq, pretrain.prediction_slots(config.data))
    self.compile_s = 0.0   # torch.compile compiles in the first step: see first_step_s

  def step(self) -> None:
    torch = self.torch
    for micro in self.micro_batches:
      with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
        loss = self.model(**micro).loss / len(self.micro_batches)
      loss.backward()
    torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
    self.optimizer.step()
    self.optimizer.zero_grad(set_to_none=True)
    if self.device.type == "cuda":
      torch.cuda.synchronize()

  def memory(self) -> dict[str, Any]:
    if self.device.type == "cuda":
      return {"peak_memory_bytes": int(self.torch.cuda.max_memory_allocated())}
    return {}


class Matmul:
  """One n×n @ n×n matmul (float32 on CPU; bfloat16 on accelerators), in JAX or torch: the achievable matmul rate
  the MFU is measured against on CPU, taken in the same interleaving as the steps it is compared with."""

  def __init__(self, n: int = 2048, framework: str = "jax", dtype: str | None = None):
    self.framework, self.name = framework, f"matmul_{framework}"
    on_cpu = jax.devices()[0].platform == "cpu"
    dtype = dtype or ("float32" if on_cpu else "bfloat16")
    self.flops_per_step = 2.0 * n ** 3
    self.compile_s = 0.0
    if framework == "jax":
      keys = jax.random.split(jax.random.key(0))
      a, b = (jax.random.normal(k, (n, n), jnp.dtype(dtype)) for k in keys)
      fn = jax.jit(jnp.dot)
      self._run = lambda: fn(a, b).block_until_ready()
    else:
      torch = import_torch()
      device = "cuda" if torch.cuda.is_available() and not on_cpu else "cpu"
      a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
      sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
      self._run = lambda: (torch.mm(a, b), sync())

  def step(self) -> None:
    self._run()

  def memory(self) -> dict[str, Any]:
    return {}


# ---------------------------------------------------------------------------------------------------------------
# Timing.

def interleave(runners: Sequence[Any], steps: int, block: int, warmup: int) -> dict[str, dict[str, Any]]:
  """Times `steps` steps of each runner in alternating blocks (order reversed every round, and one untimed step
  after each switch so a runner never pays for the other's thread pools or caches). Returns name -> times."""
  out = {}
  for r in runners:   # the first call compiles (torch.compile) or fills caches: reported, not timed
    start = time.perf_counter()
    r.step()
    out[r.name] = {"first_step_s": time.perf_counter() - start, "times": []}
  for r in runners:
    for _ in range(warmup):
      r.step()
  order = list(runners)
  while any(len(out[r.name]["times"]) < steps for r in runners):
    for r in order:
      todo = min(block, steps - len(out[r.name]["times"]))
      if todo <= 0:
        continue
      if len(runners) > 1:
        r.step()
      for _ in range(todo):
        start = time.perf_counter()
        r.step()
        out[r.name]["times"].append(time.perf_counter() - start)
    order.reverse()
  return out


def summarize(runner: Any, timing: dict[str, Any], peak: float | None) -> dict[str, Any]:
  """Median / p10 / p90 step time and what follows from the median: examples/s, tokens/s, TFLOP/s, MFU."""
  times = np.asarray(timing["times"])
  median = float(np.median(times))
  row = {"name": runner.name, "compile_s": getattr(runner, "compile_s", 0.0),
         "lower_s": getattr(runner, "lower_s", None), "first_step_s": timing["first_step_s"], "steps": len(times),
         "median_s": median, "p10_s": float(np.percentile(times, 10)), "p90_s": float(np.percentile(times, 90))}
  if hasattr(runner, "tokens_per_step"):
    row.update(examples_per_s=runner.examples_per_step / median, tokens_per_s=runner.tokens_per_step / median,
               flops_per_token=runner.flops_per_token)
    row["tflops_per_s"] = row["tokens_per_s"] * runner.flops_per_token / 1e12
    row["mfu"] = row["tflops_per_s"] * 1e12 / peak if peak else None
  else:
    row["tflops_per_s"] = runner.flops_per_step / median / 1e12
  row.update(runner.memory())
  return row


def peak_flops(matmul_row: dict[str, Any] | None) -> tuple[float | None, str]:
  """The table's bf16 peak for accelerators; on CPU (no table entry) the float32 matmul rate measured here."""
  kind = jax.devices()[0].device_kind
  table = flops.peak_flops(kind)
  if table:
    return table * jax.device_count(), f"table[{kind}] x {jax.device_count()} devices"
  if matmul_row:
    return matmul_row["tflops_per_s"] * 1e12, "measured float32 jnp.dot rate (this run)"
  return None, "unknown"


def measure(runners: Sequence[Any], args: argparse.Namespace) -> tuple[list[dict[str, Any]], float | None, str]:
  """Interleaved timing of `runners`, summarised against the device peak (see `peak_flops`). Returns rows, the
  peak and where it came from; with a `matmul_jax` runner, each row also gets its fraction of that rate."""
  timings = interleave(runners, args.steps, args.block, args.warmup)
  matmul = next((r for r in runners if r.name == "matmul_jax"), None)
  matmul_row = summarize(matmul, timings[matmul.name], None) if matmul else None
  peak, source = peak_flops(matmul_row)
  rows = [summarize(r, timings[r.name], peak) for r in runners]
  for row in rows:
    if matmul_row and "tokens_per_s" in row:
      row["fraction_of_matmul"] = row["tflops_per_s"] / matmul_row["tflops_per_s"]
  return rows, peak, source


# ---------------------------------------------------------------------------------------------------------------
# Output.

def fmt(value: Any, spec: str) -> str:
  if value is None:
    return "n/a"
  if isinstance(value, str):
    return value
  return format(value, spec)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]], title: str = "") -> str:
  """columns: (header, key, format spec). Returns (and prints) the table text, with a last line saying so when the
  machine was too busy for the figures to be quoted (bench/machine.py)."""
  cells = [[h for h, _, _ in columns]] + [[fmt(r.get(k), f) for _, k, f in columns] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
  lines = [title] if title else []
  for i, row in enumerate(cells):
    lines.append("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths))))
    if i == 0:
      lines.append("  ".join("-" * w for w in widths))
  note = machine.noisy_note()
  text = "\n".join(lines + ([note] if note else []))
  print(text, flush=True)
  return text


STEP_COLUMNS = (("runner", "name", ""), ("compile s", "compile_s", ".2f"), ("1st step s", "first_step_s", ".2f"),
                ("median ms", "median_ms", ".1f"), ("p10 ms", "p10_ms", ".1f"), ("p90 ms", "p90_ms", ".1f"),
                ("examples/s", "examples_per_s", ".1f"), ("tokens/s", "tokens_per_s", ".0f"),
                ("TFLOP/s", "tflops_per_s", ".3f"), ("MFU", "mfu", ".1%"), ("mem MiB", "memory_mib", ".0f"))


def table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Rows with the display units the STEP_COLUMNS use (ms, MiB)."""
  out = []
  for r in rows:
    memory = r.get("peak_memory_bytes") or r.get("compiled_memory_bytes")
    out.append({**r, "median_ms": r["median_s"] * 1e3, "p10_ms": r["p10_s"] * 1e3, "p90_ms": r["p90_s"] * 1e3,
                "memory_mib": memory / 2**20 if memory else None})
  return out


def matmul_rate(payload: dict[str, Any]) -> float | None:
  """The run's jnp.dot TFLOP/s: its matmul_jax row, or the measured peak of a bench that keeps only step rows."""
  rate = next((r["tflops_per_s"] for r in payload.get("rows", ()) if r.get("name") == "matmul_jax"), None)
  if rate is None and str(payload.get("peak_source", "")).startswith("measured"):
    rate = payload["peak_flops"] / 1e12
  return rate


def write_json(args: argparse.Namespace, default_name: str, module: str, payload: dict[str, Any]) -> str:
  os.makedirs(args.results_dir, exist_ok=True)
  path = os.path.join(args.results_dir, f"{args.name or default_name}.json")
  record = {"benchmark": default_name, "environment": environment(module, matmul_rate(payload)),
            "host_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **payload}
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=2, default=str)
  os.replace(path + ".tmp", path)
  print(f"wrote {path}", flush=True)
  return path


def write_json_file(path: str, record: dict[str, Any]) -> None:
  """`record` as the JSON file at `path`, replaced at once (a reader never sees half of it)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=1)
  os.replace(path + ".tmp", path)


def write_shared_json(path: str, entries: dict[str, Any], keep: Callable[[str], bool]) -> None:
  """`entries` into the JSON file at `path`, with those of its entries that `keep` accepts: another script's share
  of the file (bench.paper_small_recipes's `recipes` in bench.paper_small's); the file's order is kept, new entries
  go last."""
  old = {}
  if os.path.isfile(path):
    with open(path) as f:
      old = json.load(f)
  merged = dict.fromkeys(key for key in old if keep(key) or key in entries)
  write_json_file(path, {**merged, **entries, **{key: value for key, value in old.items() if keep(key)}})


def write_doc_section(path: str, name: str, text: str) -> None:
  """Replaces the section `name` of the markdown file at `path` (between `<!-- NAME: begin -->` and
  `<!-- NAME: end -->`), keeping the rest; a file without it gets it at its end."""
  begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
  doc = open(path).read() if os.path.isfile(path) else ""
  section = f"{begin}\n{text}\n{end}"
  if begin in doc and end in doc:
    doc = doc[:doc.index(begin)] + section + doc[doc.index(end) + len(end):]
  else:
    doc += ("\n" if doc else "") + section + "\n"
  with open(path + ".tmp", "w") as f:
    f.write(doc)
  os.replace(path + ".tmp", path)
