"""`python -m bench.paper_small --scale=cpu`: the paper's claims at a scale this machine runs
(docs/paper_small_scale.md).

One tiny ALBERT recipe, pretrained on the English prose corpus of ../shared/data (the bundled corpus where that is
absent, said in the JSON and the tables) with its own SentencePiece model, then fine-tuned on GLUE:
1. pretraining transfers: SST-2, MRPC, STS-B and RTE from the pretrained weights and from random ones;
2. Table 5: SOP, NSP and no sentence task; held-out MLM, SOP and NSP accuracy, SST-2 and MRPC;
3. Table 4: all-shared against not-shared at the same E and H (and depth, `Scale.sharing_layers`);
4. Table 3: E = 64 and 128 against E = H, all-shared.
Every run goes through `python -m albert_jax.main` in a workdir of its own under --root; a run that is not done is
started or resumed, a done one (its record in ROOT/results) is not run again. The held-out scores are `--mode=eval`'s
function called here for each sentence task, so an SOP-trained model is also scored on NSP examples and the
reverse. The pretraining runs that coincide are one run: the all-shared SOP run at the middle E is the baseline of
tables 3 and 5 (and of 4 at the scale's own depth) and the pretrained side of 1. `--report_only` rewrites the JSON and the markdown tables from
the records so far (runs not done yet are "pending").
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from bench import common, machine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = "bench.paper_small"
RANDOM = "random"   # the init of the fine-tuning runs that start from random weights
BUNDLED_CORPUS = os.path.join(REPO, "data_pipeline", "assets")
HELD_OUT = ("mlm", "sop", "nsp")   # held-out accuracies of a pretraining run
COUNTED = ("params", "flops")       # counted from the run's shapes, not measured; the other measures are GLUE tasks
# The runs get the environment this process started with; `main` then makes this process's own JAX work (the
# held-out scoring) hand accelerator memory back when done, rather than hold a preallocated share of the device
# while the runs it launches train.
RUN_ENV = dict(os.environ)
INTERRUPTED = 130   # albert_jax.main's exit status after a Ctrl-C


@dataclasses.dataclass(frozen=True)
class Scale:
  """One size of the study: the model, the pretraining and fine-tuning recipes, which tasks and how many seeds."""
  hidden_size: int
  num_hidden_layers: int
  num_attention_heads: int
  embedding_size: int                # the baseline's E (ALBERT's 128)
  small_embedding_size: int          # Table 3's smaller E (64)
  vocab_size: int
  seq_len: int
  max_predictions: int
  batch: int
  steps: int
  learning_rate: float
  eval_batches: int                  # held-out batches each pretraining run is scored on
  finetune_batch: int
  finetune_steps: int
  finetune_learning_rate: float
  seeds: int
  transfer_tasks: tuple[str, ...] = ("sst-2", "mrpc", "sts-b", "rte")
  ablation_tasks: tuple[str, ...] = ("sst-2", "mrpc")
  dtype: str = "float32"
  spm_sentences: int = 2_000_000     # sentences sampled to train the SentencePiece model
  eval_fraction: float = 0.02        # held-out documents of the corpus
  bundled_corpus: bool = False       # the small corpus shipped with the package, whatever --shared_data holds
  glue_rows: int = 0                 # 0: the GLUE files as they are; N: their first N rows (toy)
  # Table 4's depth, both rows (0: num_hidden_layers): deep enough that the layers, not the embeddings, hold most of
  # the not-shared model's parameters, as in the paper's (at L=4 the embeddings' 1.03M make not-shared only 1.9x).
  sharing_layers: int = 0
  # Table 4's learning rate, both rows (0: learning_rate): at the cpu scale's 0.01 the 12-layer all-shared model
  # stayed at the unigram plateau (held-out MLM 6.7% at step 600, train 6.4% at 900; the 4-layer had 13%).
  sharing_learning_rate: float = 0.0


SCALES = {
    # Calibrated on this 2-core machine (docs/paper_small_scale.md): about 3 h in all.
    "cpu": Scale(hidden_size=192, num_hidden_layers=4, num_attention_heads=3, embedding_size=128,
                 small_embedding_size=64, vocab_size=8000, seq_len=64, max_predictions=10, batch=32, steps=2400,
                 learning_rate=1e-2, eval_batches=32, finetune_batch=32, finetune_steps=120,
                 finetune_learning_rate=3e-4, seeds=3, sharing_layers=12, sharing_learning_rate=5e-3),
    # Not calibrated: a bigger model, longer sequences and runs, for one accelerator.
    "gpu": Scale(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, embedding_size=128,
                 small_embedding_size=64, vocab_size=16000, seq_len=128, max_predictions=20, batch=256, steps=20000,
                 learning_rate=5e-3, eval_batches=32, finetune_batch=32, finetune_steps=1000,
                 finetune_learning_rate=1e-4, seeds=5, dtype="bfloat16"),
    # The acceptance test's: seconds per run; one task and one seed for the transfer table only, the bundled corpus
    # and cut GLUE files.
    "toy": Scale(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, embedding_size=16, small_embedding_size=8,
                 vocab_size=300, seq_len=32, max_predictions=5, batch=8, steps=2, learning_rate=5e-3, eval_batches=2,
                 finetune_batch=8, finetune_steps=2, finetune_learning_rate=1e-4, seeds=1, transfer_tasks=("mrpc",),
                 ablation_tasks=(), spm_sentences=2_000, eval_fraction=0.1, bundled_corpus=True, glue_rows=32,
                 sharing_layers=3),
}


@dataclasses.dataclass(frozen=True)
class Pretraining:
  embedding_size: int
  sharing: str = "all"
  sentence_task: str = "sop"
  num_hidden_layers: int = 0   # 0: the scale's

  @property
  def name(self) -> str:
    depth = f"_l{self.num_hidden_layers}" if self.num_hidden_layers else ""
    return f"e{self.embedding_size}_{self.sharing}_{self.sentence_task}{depth}"

  def layers(self, scale: Scale) -> int:
    return self.num_hidden_layers or scale.num_hidden_layers

  def learning_rate(self, scale: Scale) -> float:
    """Table 4's deep pair has its own (`Scale.sharing_learning_rate`), where the scale sets one."""
    return (self.num_hidden_layers and scale.sharing_learning_rate) or scale.learning_rate

  def steps(self, scale: Scale) -> int:
    return scale.steps

  def config_args(self, scale: Scale) -> list[str]:
    """Its `--config` and what its recipe sets that the study's arguments (`Study.argv`) do not."""
    return [f"--config=experiments/ablation.py:size=tiny,embedding_size={self.embedding_size},sharing={self.sharing},"
            f"sentence_task={self.sentence_task}"]

  def held_out_tasks(self) -> tuple[str, ...]:   # its own first: its MLM accuracy is read there
    return tuple(dict.fromkeys((self.sentence_task, "sop", "nsp")))


@dataclasses.dataclass(frozen=True)
class Finetuning:
  init: str        # a Pretraining name, or RANDOM
  task: str
  seed: int
  learning_rate: float = 0.0   # 0: the scale's `finetune_learning_rate`

  @property
  def name(self) -> str:
    rate = f"/lr{self.learning_rate:g}" if self.learning_rate else ""
    return f"{self.init}/{self.task}{rate}/seed{self.seed}"


def baseline(scale: Scale) -> Pretraining:
  return Pretraining(scale.embedding_size)


def sharing_pair(scale: Scale) -> tuple[Pretraining, Pretraining]:
  """Table 4's rows: all-shared and not-shared at its depth (the first is the baseline where that is the scale's)."""
  shared = dataclasses.replace(baseline(scale), num_hidden_layers=scale.sharing_layers)
  return shared, dataclasses.replace(shared, sharing="none")


def pretraining_runs(scale: Scale) -> list[Pretraining]:
  """Each distinct pretraining run once, the baseline first, the costliest (Table 4's at its depth) last."""
  base = baseline(scale)
  runs = [base, dataclasses.replace(base, sentence_task="nsp"), dataclasses.replace(base, sentence_task="none"),
          Pretraining(scale.small_embedding_size), Pretraining(scale.hidden_size), *sharing_pair(scale)]
  return list(dict.fromkeys(runs))


def finetuning_runs(scale: Scale, init: str) -> list[Finetuning]:
  """The fine-tuning runs that start from `init`: every transfer task from the baseline and from random weights,
  the ablation tasks from every other pretraining run."""
  tasks = scale.transfer_tasks if init in (baseline(scale).name, RANDOM) else scale.ablation_tasks
  return [Finetuning(init, task, seed) for task in tasks for seed in range(scale.seeds)]


def plan(scale: Scale) -> list[Pretraining | Finetuning]:
  """Every run in the order that completes rows early: each pretraining run, then its fine-tuning runs (after the
  baseline's, those from random weights)."""
  runs = []
  for pretraining in pretraining_runs(scale):
    inits = [pretraining.name] + ([RANDOM] if pretraining == baseline(scale) else [])
    runs += [pretraining] + [r for init in inits for r in finetuning_runs(scale, init)]
  return runs


# ---------------------------------------------------------------------------------------------------------------
# Command lines: what a user would type for each run.

@dataclasses.dataclass(frozen=True)
class Study:
  scale: Scale
  root: str
  glue: str        # the GLUE root the fine-tuning runs read
  corpus: str      # "shared" or "bundled"
  plan: Callable[[Scale], list[Pretraining | Finetuning]] = plan   # the study's runs, in order

  def shape_of(self, run: Finetuning) -> Pretraining:
    """The pretraining run whose model `run` fine-tunes (from random weights: the baseline's)."""
    return baseline(self.scale) if run.init == RANDOM else next(p for p in self.plan(self.scale) if p.name == run.init)

  def workdir(self, name: str) -> str:
    return os.path.join(self.root, "runs", name)

  def record_path(self, name: str) -> str:
    return os.path.join(self.root, "results", name.replace("/", "-") + ".json")

  @property
  def spm_model(self) -> str:
    return os.path.join(self.root, "data", "spm.model")

  @property
  def prepared(self) -> str:
    return os.path.join(self.root, "data", "prepared")

  def argv(self, run: Pretraining | Finetuning) -> list[str]:
    """The run's `python -m albert_jax.main` arguments: the model every run shares, then the run's own."""
    s = self.scale
    layers = (run if isinstance(run, Pretraining) else self.shape_of(run)).layers(s)
    model = dict(vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=4 * s.hidden_size,
                 num_hidden_layers=layers, num_attention_heads=s.num_attention_heads,
                 max_position_embeddings=s.seq_len, scan_unroll=layers)
    shared = [f"--workdir={self.workdir(run.name)}", *(f"--config.model.{k}={v}" for k, v in model.items()),
              f"--config.data.max_seq_length={s.seq_len}",
              f"--config.compilation_cache_dir={os.path.join(self.root, 'compilation_cache')}"]
    return self._pretraining(run, shared) if isinstance(run, Pretraining) else self._finetuning(run, shared)

  def _pretraining(self, run: Pretraining, shared: list[str]) -> list[str]:
    s, steps = self.scale, run.steps(self.scale)
    every = max(1, steps // 4)
    return [*run.config_args(s), *shared, f"--config.model.dtype={s.dtype}",
            "--config.model.remat_policy=none", "--config.data.kind=prepared", f"--config.data.path={self.prepared}",
            f"--config.data.spm_model={self.spm_model}", f"--config.data.max_predictions_per_seq={s.max_predictions}",
            f"--config.train.global_batch_size={s.batch}", f"--config.train.num_train_steps={steps}",
            f"--config.train.warmup_steps={max(1, s.steps // 20)}",
            f"--config.train.learning_rate={run.learning_rate(s)}",
            f"--config.train.eval_every={every}", f"--config.train.eval_batches={s.eval_batches}",
            f"--config.checkpoint.every={every}", "--config.checkpoint.keep=2",
            f"--config.log.every={max(1, steps // 24)}", "--config.seed=0"]

  def _finetuning(self, run: Finetuning, shared: list[str]) -> list[str]:
    s, every = self.scale, max(1, self.scale.finetune_steps // 4)
    shape = self.shape_of(run)
    init = (["--config.allow_random_init=True"] if run.init == RANDOM
            else [f"--config.init_checkpoint={self.workdir(run.init)}"])
    return [f"--config=experiments/glue.py:task={run.task},size=tiny,data={self.glue},spm={self.spm_model}",
            *shared, *init, f"--config.model.embedding_size={shape.embedding_size}",
            f"--config.model.sharing={shape.sharing}", f"--config.train.global_batch_size={s.finetune_batch}",
            f"--config.train.num_train_steps={s.finetune_steps}",
            f"--config.train.warmup_steps={max(1, s.finetune_steps // 10)}",
            f"--config.train.learning_rate={run.learning_rate or s.finetune_learning_rate}",
            f"--config.train.eval_every={every}",
            f"--config.checkpoint.every={s.finetune_steps}", f"--config.log.every={every}", f"--config.seed={run.seed}"]


# ---------------------------------------------------------------------------------------------------------------
# Running: the data once, then each run not yet recorded.

def corpus_files(scale: Scale, shared_data: str) -> tuple[list[str], str]:
  shared = sorted(glob.glob(os.path.join(shared_data, "corpus", "*.txt")))
  if shared and not scale.bundled_corpus:
    return shared, "shared"
  return sorted(glob.glob(os.path.join(BUNDLED_CORPUS, "*.txt"))), "bundled"


def prepare_data(study: Study, files: list[str]) -> None:
  """The corpus's own SentencePiece model, then its prepared shards (each step resumes or is skipped once done)."""
  from data_pipeline import train_spm
  from data_pipeline.prepare import PrepareConfig, prepare
  from data_pipeline.sources import Source
  corpus = ",".join(files)
  if not os.path.isfile(study.spm_model):
    train_spm.train(Source(corpus, format="paragraphs"), study.spm_model, vocab_size=study.scale.vocab_size,
                    input_sentence_size=study.scale.spm_sentences, num_threads=common.cpu_threads())
  workers = 1 if study.corpus == "bundled" else common.cpu_threads()   # 0.9 MB: quicker than starting a worker
  prepare(PrepareConfig(input=corpus, format="paragraphs", spm_model=study.spm_model, output_dir=study.prepared,
                        num_shards=8, eval_fraction=study.scale.eval_fraction, workers=workers))


def check_settings(study: Study, record: bool) -> None:
  """A root holds one study: records of other settings (another scale or model) would fill the tables with runs
  of another recipe, so they are refused. `record`: write the settings of a new root."""
  from albert_jax.errors import InputError
  path = os.path.join(study.root, "settings.json")
  settings = json.loads(json.dumps({"scale": dataclasses.asdict(study.scale), "corpus": study.corpus}))
  if os.path.isfile(path):
    with open(path) as f:
      if json.load(f) != settings:
        raise InputError(f"--root={study.root} holds a study of other settings ({path}); pass another --root, or "
                         "remove that folder to start afresh.")
  elif record:
    common.write_json_file(path, settings)


def glue_root(scale: Scale, shared_data: str, root: str) -> str:
  """Where the fine-tuning runs read GLUE: the shared folder, or (toy) ROOT/glue, a copy of each file's first rows."""
  return os.path.join(root, "glue") if scale.glue_rows else os.path.join(shared_data, "glue")


def copy_glue(study: Study, shared_data: str) -> None:
  """Checks the shared GLUE folder; for a scale with `glue_rows`, writes the cut copies the study reads."""
  from albert_jax.errors import MissingFileError
  from albert_jax.tasks.glue import spec_for
  source = os.path.join(shared_data, "glue")
  if not os.path.isdir(source):
    raise MissingFileError(f"No GLUE data at {source}; pass --shared_data=DIR, a folder with glue/ (SST-2/, MRPC/, "
                           "STS-B/, RTE/ as GLUE's download script writes them).")
  if not study.scale.glue_rows:
    return
  for task in dict.fromkeys(study.scale.transfer_tasks + study.scale.ablation_tasks):
    directory = spec_for(task).directory
    os.makedirs(os.path.join(study.glue, directory), exist_ok=True)
    for split in ("train.tsv", "dev.tsv"):
      with open(os.path.join(source, directory, split), encoding="utf-8-sig") as f:
        lines = f.readlines()[:study.scale.glue_rows + 1]   # with the header
      with open(os.path.join(study.glue, directory, split), "w", encoding="utf-8") as f:
        f.writelines(lines)


def launch(study: Study, run: Pretraining | Finetuning) -> dict[str, Any]:
  """`python -m albert_jax.main` for the run, its output in ROOT/logs: its wall time, the step it started from and
  the other processes' CPU share meanwhile. A Ctrl-C reaches the run too, which is waited for while it saves its
  step; a failed run stops the study, naming its log."""
  from albert_jax.run import Run, config as run_config
  argv, workdir = study.argv(run), study.workdir(run.name)
  start_step = run_config.latest_step(Run(workdir)) if os.path.isdir(workdir) else None
  log = os.path.join(study.root, "logs", run.name.replace("/", "-") + ".log")
  os.makedirs(os.path.dirname(log), exist_ok=True)
  print(f"[{time.strftime('%H:%M:%S')}] {run.name}: python -m albert_jax.main {' '.join(argv)}", flush=True)
  before = machine.sample()
  with open(log, "a") as out, subprocess.Popen([sys.executable, "-m", "albert_jax.main", *argv], cwd=REPO,
                                               env=RUN_ENV, stdout=out, stderr=subprocess.STDOUT) as proc:
    try:
      code = proc.wait()
    except KeyboardInterrupt:
      proc.wait()
      raise
  after = machine.sample()
  if code == INTERRUPTED:
    raise SystemExit(f"{run.name} was interrupted (its log says which step it saved: {log}); rerun the same "
                     "command to resume it.")
  if code:
    with open(log) as f:
      tail = "".join(f.readlines()[-15:])
    raise SystemExit(f"{tail}\nerror: {run.name} failed (exit status {code}); its log: {log}")
  wall = round(after.wall - before.wall, 1)
  print(f"[{time.strftime('%H:%M:%S')}] {run.name}: done in {wall:.0f} s", flush=True)
  return {"name": run.name, "run": dataclasses.asdict(run), "wall_s": wall, "from_step": start_step or 0,
          "other_cpu_share": machine.others_share(before, after)}


def experiment_config(study: Study, run: Pretraining, *overrides: str):
  """The run's config, parsed as `albert_jax.main` parses its command line."""
  from albert_jax import cli
  return cli.experiment_config(["albert_jax.main", *study.argv(run), *overrides])


def score(study: Study, run: Pretraining, sentence_task: str) -> dict[str, float]:
  """`--mode=eval` of the run (the function `albert_jax.main` runs for it, in this process) on held-out examples
  built for `sentence_task`, whatever task the run was trained on."""
  from albert_jax import compilation_cache, runner
  from albert_jax.run import Run
  config = experiment_config(study, run, f"--config.data.sentence_task={sentence_task}")
  folder = Run(study.workdir(run.name))
  compilation_cache.use(config, folder)
  return runner.run(config, folder, "eval")


@functools.cache
def backbone_params(study: Study, run: Pretraining) -> int:
  """As `--mode=describe` counts them, from shapes (nothing is run)."""
  from albert_jax import describe, pretrain
  from albert_jax.model_config import model_config_from
  config = experiment_config(study, run)
  return describe.describe(model_config_from(config), config.data.max_seq_length,
                           pretrain.prediction_slots(config.data))["params_backbone"]


def held_out_curve(workdir: str) -> list[dict[str, float]]:
  """The held-out evaluations the run logged while training (every quarter of its steps)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [{"step": r["step"], **{k.removeprefix("eval/"): v for k, v in r.items() if k.startswith("eval/")}}
          for r in rows if any(k.startswith("eval/") for k in r)]


def run_and_record(study: Study, run: Pretraining | Finetuning) -> dict[str, Any]:
  """Runs `run`, then what the tables read: a pretraining run's held-out scores (on its own task's examples first,
  where its MLM accuracy is read, then SOP and NSP), a fine-tuning run's best dev record."""
  from albert_jax.run import Run
  from albert_jax.run.best import read_best
  record = launch(study, run)
  if isinstance(run, Pretraining):
    record.update(kind="pretraining", held_out={task: score(study, run, task) for task in run.held_out_tasks()},
                  curve=held_out_curve(study.workdir(run.name)))
  else:
    record.update(kind="finetuning", best=read_best(Run(study.workdir(run.name))))
  return record




# ---------------------------------------------------------------------------------------------------------------
# The tables: ours beside the paper's (ALBERT-base, Lan et al. 2020), from whatever runs are recorded.

PAPER = {   # Tables 3 (all-shared), 4 (E=128) and 5; "avg": the mean over its SQuAD1.1/2.0, MNLI, SST-2 and RACE
    "transfer": {"pretrained": {"sst-2": 90.3}, RANDOM: {}},
    "sentence_task": {"sop": {"mlm": 54.0, "sop": 86.5, "nsp": 78.9, "sst-2": 90.3, "avg": 80.1},
                      "nsp": {"mlm": 54.5, "sop": 52.0, "nsp": 90.5, "sst-2": 91.1, "avg": 79.2},
                      "none": {"mlm": 54.9, "sop": 53.3, "nsp": 52.4, "sst-2": 89.9, "avg": 79.0}},
    "sharing": {"all": {"params": 12e6, "sst-2": 90.3, "avg": 80.1},
                "none": {"params": 89e6, "sst-2": 91.5, "avg": 81.6}},
    "embedding": {"e128": {"params": 12e6, "sst-2": 90.3, "avg": 80.1},
                  "e64": {"params": 10e6, "sst-2": 89.4, "avg": 79.0},
                  "eH": {"params": 31e6, "sst-2": 90.6, "avg": 79.8}},
}
LABELS = {"params": "backbone params", "mlm": "MLM acc.", "sop": "SOP acc.", "nsp": "NSP acc.", "sst-2": "SST-2 acc.",
          "mrpc": "MRPC acc.", "sts-b": "STS-B Pearson", "rte": "RTE acc.", "avg": "avg", "glue": "GLUE score",
          "mnli": "MNLI-m acc.", "flops": "pretraining FLOPs"}
PAPER_MEASURE = {"mrpc": "avg", "sts-b": "avg", "rte": "avg"}   # no MRPC in the paper's ablations: its average


@dataclasses.dataclass(frozen=True)
class Table:
  key: str
  title: str
  rows: dict[str, tuple[str, str]]   # row key -> (label, its pretraining run or RANDOM); the first: the reference
  measures: tuple[str, ...]
  # The fine-tuning learning rates each row runs at (0: the scale's); a row's GLUE cell is its best rate's, chosen
  # by the median over the seeds on the dev set, as the papers choose theirs per task.
  learning_rates: tuple[float, ...] = (0.0,)


def tables(scale: Scale) -> list[Table]:
  base, (shared, not_shared) = baseline(scale), sharing_pair(scale)
  e, h = scale.embedding_size, scale.hidden_size
  variant = lambda **change: dataclasses.replace(base, **change).name
  return [
      Table("transfer", "Pretraining transfers: pretrained against random weights, same recipe and seeds",
            {"pretrained": (f"pretrained ({base.name})", base.name), RANDOM: ("random init", RANDOM)},
            scale.transfer_tasks),
      Table("sentence_task", f"Table 5: the sentence-pair task (all-shared, E={e}, H={h})",
            {t: (t.upper() if t != "none" else "none", variant(sentence_task=t)) for t in ("sop", "nsp", "none")},
            (*HELD_OUT, *scale.ablation_tasks)),
      Table("sharing", f"Table 4: cross-layer sharing (L={shared.layers(scale)}, E={e}, H={h})",
            {"all": ("all-shared", shared.name), "none": ("not-shared", not_shared.name)},
            ("params", "mlm", *scale.ablation_tasks)),
      Table("embedding", f"Table 3: the embedding size E (all-shared, H={h})",
            {"e128": (f"E={e}", base.name), "e64": (f"E={scale.small_embedding_size}",
                                                    variant(embedding_size=scale.small_embedding_size)),
             "eH": (f"E=H={h}", variant(embedding_size=h))}, ("params", "mlm", *scale.ablation_tasks)),
  ]


def runs_of(table: Table, scale: Scale) -> set[str]:
  """The names of the runs a table reads: its rows' pretraining runs and their fine-tuning runs on its tasks."""
  names = set()
  for _, init in table.rows.values():
    names |= {init} - {RANDOM}
    names |= {Finetuning(init, m, seed, rate).name for m in table.measures if m not in (*COUNTED, *HELD_OUT)
              for rate in table.learning_rates for seed in range(scale.seeds)}
  return names


def selected_runs(scale: Scale, table_keys: str, tables_of=tables, plan_of=plan) -> list[Pretraining | Finetuning]:
  """The runs of the tables of `tables_of(scale)` named in `table_keys` (comma-separated; empty: all), in order."""
  from albert_jax.errors import InputError
  by_key = {table.key: table for table in tables_of(scale)}
  keys = [k for k in table_keys.split(",") if k] or list(by_key)
  if unknown := [k for k in keys if k not in by_key]:
    raise InputError(f"--tables={table_keys}: no table {unknown[0]!r}; choose among {', '.join(by_key)}.")
  names = set().union(*(runs_of(by_key[k], scale) for k in keys))
  return [run for run in plan_of(scale) if run.name in names]


def cell(records: dict[str, dict], counts: dict[str, dict], init: str, measure: str, scale: Scale,
         learning_rates: tuple[float, ...] = (0.0,)) -> dict[str, Any]:
  """Our value of `measure` for the runs from `init`, in %: a GLUE task's median over the seeds with their range
  (at the best of `learning_rates` by that median, with each rate's median, where there are several), or a held-out
  accuracy with the number of examples it was measured on; or a count (`COUNTED`) from `counts`."""
  if measure in COUNTED:
    return {"status": "done", "value": counts[measure][init]}
  if measure not in HELD_OUT:
    by_rate = {rate: values for rate in learning_rates
               if (values := [100 * records[name]["best"]["value"] for seed in range(scale.seeds)
                              if (name := Finetuning(init, measure, seed, rate).name) in records])}
    if not by_rate:
      return {"status": "pending"}
    rate, values = max(by_rate.items(), key=lambda item: statistics.median(item[1]))   # ties: the first rate
    runs = sum(map(len, by_rate.values()))
    found = {"status": "done" if runs == scale.seeds * len(learning_rates) else "partial",
             "value": statistics.median(values), "min": min(values), "max": max(values), "seeds": values,
             "runs": runs, "runs_total": scale.seeds * len(learning_rates)}
    if len(learning_rates) > 1:
      found |= {"learning_rate": rate or scale.finetune_learning_rate,
                "median_by_rate": {f"{r or scale.finetune_learning_rate:g}": statistics.median(v)
                                   for r, v in by_rate.items()}}
    return found
  if init not in records:
    return {"status": "pending"}
  held_out = records[init]["held_out"]
  if measure == "mlm":   # on its own task's examples
    return {"status": "done", "value": 100 * next(iter(held_out.values()))["mlm_accuracy"],
            "examples": scale.eval_batches * scale.batch * scale.max_predictions}
  chance = held_out[measure].get(f"{measure}_majority_accuracy")   # absent from a record of an earlier version
  return {"status": "done", "value": 100 * held_out[measure][f"{measure}_accuracy"],
          "examples": scale.eval_batches * scale.batch, "chance": None if chance is None else 100 * chance}


def compare(a: dict, b: dict, paper_sign: int) -> dict[str, Any]:
  """Row a against the reference row b: which is larger here, against the paper's `paper_sign`, and whether our
  difference is inside the noise: the seeds' ranges overlap or, for a held-out accuracy, the difference is within
  2 standard errors of the two binomial estimates (for MLM an upper bound on the masked tokens is taken: short
  sequences hold fewer)."""
  if a["status"] == "pending" or b["status"] == "pending":
    return {"paper_sign": paper_sign, "status": "pending"}
  ours = (a["value"] > b["value"]) - (a["value"] < b["value"])
  if "min" in a:
    noise, inside = "seed ranges", a["min"] <= b["max"] and b["min"] <= a["max"]
  elif "examples" in a:
    variance = sum(x["value"] * (100 - x["value"]) / x["examples"] for x in (a, b))
    noise, inside = "2 s.e.", abs(a["value"] - b["value"]) <= 2 * variance ** 0.5
  else:
    noise, inside = "exact", False
  return {"paper_sign": paper_sign, "our_sign": ours, "difference": a["value"] - b["value"],
          "same_direction": ours == paper_sign, "inside_noise": inside, "noise": noise, "status": "done"}


def build_tables(scale: Scale, records: dict[str, dict], counts: dict[str, dict], table_list: list[Table] | None = None,
                 papers: dict[str, dict] = PAPER, paper_measures: dict[str, dict] | None = None) -> dict[str, Any]:
  """Each table's cells, the paper's figures, and every row compared with the first on each measure the paper has
  for both (the transfer table: pretraining's premise, pretrained > random, as the paper has no random-init run).
  `paper_measures`: per table, our measure -> the paper's figure it is compared with (default: `PAPER_MEASURE`)."""
  out = {}
  for table in tables(scale) if table_list is None else table_list:
    paper, to_paper = papers[table.key], (paper_measures or {}).get(table.key, PAPER_MEASURE)
    rows = {key: {m: cell(records, counts, init, m, scale, table.learning_rates) for m in table.measures}
            for key, (_, init) in table.rows.items()}
    reference, *others = table.rows
    comparisons = []
    for key in others:
      for m in table.measures:
        paper_a, paper_b = (paper[row].get(to_paper.get(m, m)) for row in (key, reference))
        if table.key == "transfer":   # random < pretrained
          paper_sign = -1
        elif paper_a is None or paper_b is None:
          continue
        else:
          paper_sign = (paper_a > paper_b) - (paper_a < paper_b)
        comparisons.append({"row": key, "against": reference, "measure": m,
                            "paper_measure": "premise" if table.key == "transfer" else to_paper.get(m, m),
                            **compare(rows[key][m], rows[reference][m], paper_sign)})
    out[table.key] = {"title": table.title, "labels": {k: label for k, (label, _) in table.rows.items()},
                      "runs": {k: init for k, (_, init) in table.rows.items()}, "rows": rows, "paper": paper,
                      "comparisons": comparisons}
  return out


README_DEFAULT_MLM = 10.5   # held-out MLM accuracy (%) of the README's 500-step default run


def acceptance(tables_payload: dict[str, Any]) -> list[dict[str, Any]]:
  """The study's targets (those of its issue), each with the values it reads, in the tables' units, and whether it
  is met: None while a value is pending, or where the scale does not measure it (the toy scale has no SST-2)."""
  def value(table: str, row: str, measure: str, field: str = "value") -> float | None:
    found = tables_payload[table]["rows"][row].get(measure, {"status": "pending"})
    return None if found["status"] == "pending" else found[field]

  def target(claim: str, test, *values: float | None) -> dict[str, Any]:
    return {"claim": claim, "values": list(values), "met": None if None in values else bool(test(*values))}

  return [
      *(target(f"pretrained > random init on {LABELS[task]}", lambda a, b: a > b,
               value("transfer", "pretrained", task), value("transfer", RANDOM, task)) for task in ("sst-2", "mrpc")),
      target(f"held-out MLM acc. of the baseline above the README default's {README_DEFAULT_MLM}",
             lambda a: a > README_DEFAULT_MLM, value("sentence_task", "sop", "mlm")),
      target("SOP-trained ≥ 75 on held-out SOP", lambda a: a >= 75, value("sentence_task", "sop", "sop")),
      target("SOP-trained above NSP-trained on held-out SOP by ≥ 10", lambda a, b: a - b >= 10,
             value("sentence_task", "sop", "sop"), value("sentence_task", "nsp", "sop")),
      target("NSP-trained within 5 of chance (the commoner label's share) on held-out SOP",
             lambda a, chance: abs(a - chance) <= 5, value("sentence_task", "nsp", "sop"),
             value("sentence_task", "nsp", "sop", "chance")),
      target("not-shared ≥ all-shared on held-out MLM", lambda a, b: a >= b,
             value("sharing", "none", "mlm"), value("sharing", "all", "mlm")),
      target("not-shared has ≥ 3× the backbone params of all-shared", lambda a, b: a >= 3 * b,
             value("sharing", "none", "params"), value("sharing", "all", "params")),
  ]


def read_records(study: Study) -> dict[str, dict]:
  records = {}
  for run in study.plan(study.scale):
    if os.path.isfile(study.record_path(run.name)):
      with open(study.record_path(run.name)) as f:
        records[run.name] = json.load(f)
  return records


SIGN = {1: ">", 0: "=", -1: "<"}


def fmt(value: dict | float | None, measure: str) -> str:
  """A cell (ours: median and min–max over the seeds) or a paper figure."""
  if isinstance(value, dict):
    if value["status"] == "pending":
      return "pending"
    partial = f" [{value['runs']} of {value['runs_total']} runs]" if value["status"] == "partial" else ""
    spread = f" ({value['min']:.1f}–{value['max']:.1f})" if "min" in value else ""
    rate = f" at lr {value['learning_rate']:g}" if "learning_rate" in value else ""
    return fmt(value["value"], measure) + spread + rate + partial
  if value is None:
    return "—"
  if measure == "flops":
    return f"{value:.3g}"
  return f"{value / 1e6:.2f}M" if measure == "params" else f"{value:.1f}"


def markdown(scale_name: str, payload: dict[str, Any]) -> str:
  """One scale's tables: ours beside the paper's, then each row against the first."""
  lines = [f"Scale `{scale_name}`, corpus: {payload['corpus']}; {payload['runs_done']} of {payload['runs_total']} "
           f"runs done, {payload['wall_s_done'] / 3600:.2f} h of runs",
           f"(regenerate: `python -m {MODULE} --scale={scale_name} --report_only`).",
           "", "**The targets**", "", "| target | ours | met |", "|---|---|---|"]
  for t in payload["acceptance"]:
    measure = "params" if "params" in t["claim"] else ""
    ours = " vs ".join("pending" if v is None else fmt(v, measure) for v in t["values"])
    lines.append(f"| {t['claim']} | {ours} | {'—' if t['met'] is None else 'yes' if t['met'] else '**no**'} |")
  for table in payload["tables"].values():
    lines += table_lines(table)
  return "\n".join(lines)


def table_lines(table: dict[str, Any]) -> list[str]:
  """One table of the JSON in markdown: ours beside the paper's, the chance levels, each row against the first."""
  measures, lines = list(next(iter(table["rows"].values()))), []
  paper_measures = list(dict.fromkeys(m for row in table["paper"].values() for m in row))
  header = ["", *(LABELS[m] for m in measures), *(f"paper: {LABELS[m]}" for m in paper_measures)]
  lines += ["", f"**{table['title']}**", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
  for key, row in table["rows"].items():
    cells = [fmt(row[m], m) for m in measures] + [fmt(table["paper"][key].get(m), m) for m in paper_measures]
    lines.append(f"| {table['labels'][key]} | " + " | ".join(cells) + " |")
  if chances := [f"{LABELS[m]} {fmt(cell['chance'], m)}" for m, cell in next(iter(table["rows"].values())).items()
                 if cell.get("chance")]:
    lines += ["", "Chance on these held-out examples (always answering the commoner label; one-sentence chunks "
              f"always take label 1): {', '.join(chances)}."]
  lines += ["", "| comparison | paper | ours | same direction | inside the noise |", "|---|---|---|---|---|"]
  for c in table["comparisons"]:
    done, measure = c["status"] == "done", c["measure"]
    paper_measure = "pretraining's premise" if c["paper_measure"] == "premise" else LABELS[c["paper_measure"]]
    difference = fmt(abs(c["difference"]), measure) if done else ""
    lines.append(" | ".join([
        f"| {LABELS[measure]}: {table['labels'][c['row']]} vs {table['labels'][c['against']]}",
        SIGN[c["paper_sign"]] + (f" ({paper_measure})" if paper_measure != LABELS[measure] else ""),
        f"{SIGN[c['our_sign']]} (by {difference})" if done else "pending",
        ("yes" if c["same_direction"] else "**no**") if done else "—",
        f"{'yes' if c['inside_noise'] else 'no'} ({c['noise']})" if done else "—"]) + " |")
  return lines



def report(args: argparse.Namespace, study: Study) -> dict[str, Any]:
  """The JSON and the markdown section, from the records under --root (runs without one: pending)."""
  records = read_records(study)
  runs = plan(study.scale)
  payload = {"benchmark": "paper_small", "scale": args.scale, "settings": dataclasses.asdict(study.scale),
             "corpus": study.corpus, "root": study.root, "runs_total": len(runs), "runs_done": len(records),
             "wall_s_done": sum(r["wall_s"] for r in records.values()),
             "tables": build_tables(study.scale, records, {"params": {
                 run.name: backbone_params(study, run) for run in pretraining_runs(study.scale)}}),
             "runs": {r.name: records.get(r.name, {"status": "pending"}) for r in runs},
             "commands": {r.name: "python -m albert_jax.main " + " ".join(study.argv(r)) for r in runs},
             "environment": common.environment(MODULE)}
  payload["acceptance"] = acceptance(payload["tables"])
  common.write_shared_json(args.results, payload, keep=lambda key: key == "recipes")
  common.write_doc_section(args.doc, f"{MODULE} {args.scale}", markdown(args.scale, payload))
  print(f"wrote {args.results} and {args.doc}: {len(records)} of {len(runs)} runs done", flush=True)
  return payload


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--scale", default="cpu", choices=sorted(SCALES))
  p.add_argument("--root", default="", help="the runs' workdirs, logs and records (default: "
                 f"{tempfile.gettempdir()}/albert_paper_small_SCALE); rerunning resumes there")
  p.add_argument("--shared_data", default=os.environ.get("ALBERT_JAX_SHARED_DATA",
                                                         os.path.join(os.path.dirname(REPO), "shared", "data")),
                 help="the folder with glue/ and corpus/ (without corpus/: the bundled corpus, said in the tables)")
  p.add_argument("--results", default="", help="the JSON (default: bench/results/paper_small_SCALE.json)")
  p.add_argument("--doc", default=os.path.join(REPO, "docs", "paper_small_scale.md"),
                 help="the markdown file whose section for this scale is rewritten")
  p.add_argument("--tables", default="", help="run only what these tables need, comma-separated (transfer, "
                 "sentence_task, sharing, embedding; default: all); the report covers every table")
  p.add_argument("--report_only", action="store_true", help="rewrite the JSON and the tables; run nothing")
  args = p.parse_args(argv)
  args.root = os.path.abspath(args.root or os.path.join(tempfile.gettempdir(), f"albert_paper_small_{args.scale}"))
  args.results = args.results or os.path.join(common.RESULTS_DIR, f"paper_small_{args.scale}.json")
  return args


def main(argv: list[str] | None = None, plan_of=plan, tables_of=tables, report_of=None) -> dict[str, Any]:
  """The study of `plan_of` and `tables_of`, reported by `report_of` (default: this module's; bench.paper_small_recipes
  passes its own)."""
  from albert_jax import console
  from albert_jax.errors import one_line_user_errors
  console.install()
  os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
  args = parse_args(argv)
  scale = SCALES[args.scale]
  files, corpus = corpus_files(scale, args.shared_data)
  study = Study(scale, args.root, glue_root(scale, args.shared_data, args.root), corpus, plan_of)
  report_of = report_of or report
  with one_line_user_errors():
    runs = selected_runs(scale, args.tables, tables_of, plan_of)
    check_settings(study, record=not args.report_only)
    if not args.report_only:
      copy_glue(study, args.shared_data)
      prepare_data(study, files)
      try:
        for run in runs:
          if not os.path.isfile(study.record_path(run.name)):
            common.write_json_file(study.record_path(run.name), run_and_record(study, run))
            report_of(args, study)
      except KeyboardInterrupt:
        print("Interrupted: rerun the same command to go on (recorded runs are kept, the others resume).",
              file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    return report_of(args, study)


if __name__ == "__main__":
  main()
