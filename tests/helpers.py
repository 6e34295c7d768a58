"""Plain helpers and constants that several test modules use: the optional-module guard (`require_module`), the
command lines of pretraining, fine-tuning, TPU compilation and the data tools, what a pretraining workdir holds,
the tiny model and its batch, small fine-tuning data cut from ../shared/data, and SQuAD task helpers.

Fixtures live in tests/conftest.py; fault-injection launches in tests/processes.py; transformers models in
tests/hf_models.py; the official SQuAD scorer in tests/squad_official.py. No test module imports another.
"""
import contextlib
import copy
import csv
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax.model_config import model_config_for

REPO = Path(__file__).resolve().parents[1]
ALICE = REPO / "data_pipeline" / "assets" / "gutenberg_00011_alice_in_wonderland.txt"


# ------------------------------------------------------------------------------------------- optional modules

def require_module(name: str, extra: str | None = None):
  """`import name`. Where it is not installed, a failure in CI (CI set) and a skip elsewhere, as for the shared data
  (tests/conftest.py). `extra` is the setup.py extra that installs it (None: the base install)."""
  try:
    return importlib.import_module(name)
  except ImportError as error:
    install = f"pip install -e '.[{extra}]'" if extra else "pip install -e ."
    if os.environ.get("CI"):
      pytest.fail(f"CI must install {name} ({install}): {error}", pytrace=False)
    pytest.skip(f"{name} is not installed: {install}", allow_module_level=True)


# --------------------------------------------------------------------------------------------- pretraining

SMALL_RUN = ["--config.model.hidden_size=64", "--config.model.intermediate_size=256",
             "--config.train.global_batch_size=8", "--config.data.max_seq_length=32",
             "--config.data.max_predictions_per_seq=5", "--config.model.vocab_size=300",
             "--config.model.max_position_embeddings=32", "--config.train.eval_every=0", "--config.log.every=1",
             "--config.train.warmup_steps=2", "--config.checkpoint.async_save=false"]


def cpu_xla_flags(devices: int, fast_compile: bool = False) -> str:
  """XLA_FLAGS of a test's process: `devices` virtual CPU devices; with fast_compile, XLA's CPU backend at -O0 (a
  tiny model's steps compile 2-3x faster; only where no result is compared with one compiled otherwise)."""
  return f"--xla_force_host_platform_device_count={devices}" + (
      " --xla_backend_optimization_level=0" if fast_compile else "")


def cpu_env(devices: int = 1, fast_compile: bool = False) -> dict[str, str]:
  """The environment of a test's `albert_jax.main` process: jax on the CPU, XLA_FLAGS as `cpu_xla_flags`."""
  return dict(os.environ, XLA_FLAGS=cpu_xla_flags(devices, fast_compile), JAX_PLATFORMS="cpu")


def pretrain_cli(workdir, *overrides, devices=1, config="experiments/pretrain_tiny.py:synthetic", extra_env=None,
                 wait=True, fast_compile=False):
  """`python -m albert_jax.main` on `devices` virtual CPU devices: the finished process, or (wait=False) the
  running one with stdout and stderr merged."""
  env = {**cpu_env(devices, fast_compile), **(extra_env or {})}
  cmd = [sys.executable, "-m", "albert_jax.main", f"--config={config}", f"--workdir={workdir}", *overrides]
  if not wait:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str):
  """A tmpfs of `size` ("3m") mounted at `folder` (needs root, as CI has; elsewhere a skip)."""
  import pytest
  folder.mkdir()
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                           text=True)
  if mounted.returncode:
    if os.environ.get("CI"):
      pytest.fail(f"CI must be able to mount a tmpfs: {mounted.stderr}")
    pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr}")
  try:
    yield folder
  finally:
    subprocess.run(["umount", str(folder)], check=True)


def final_params(workdir):
  """(step, parameters) of the newest checkpoint of a pretraining workdir."""
  from albert_jax import checkpointing
  from albert_jax.run import Run
  ckpt = checkpointing.Checkpointer(Run(str(workdir)).checkpoints, 1, 1)
  return ckpt.latest_step(), jax.tree.map(np.asarray, ckpt.restore_params())


def logged(workdir, key="loss"):
  """{step: value of `key`} of the workdir's metrics.jsonl."""
  rows = [json.loads(line) for line in open(Path(workdir) / "metrics.jsonl")]
  return {r["step"]: r[key] for r in rows if key in r}


def assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def prepared_run(path) -> list[str]:
  """Overrides that pretrain a small model on the prepared data at `path` (ALBERT's 30000-piece vocabulary)."""
  return ["--config.data.kind=prepared", f"--config.data.path={path}", "--config.model.vocab_size=30000",
          "--config.data.max_seq_length=32", "--config.model.max_position_embeddings=32",
          "--config.train.global_batch_size=4", "--config.log.every=1"]


def compile_env() -> dict[str, str]:
  """The environment of `--mode=compile`: the mode itself keeps jax on the CPU."""
  return {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}


# `python -m albert_jax.main` with the step-time bound left out of the report: the bound's second compile, of every
# layer unrolled, takes most of a large model's compile time and tests that check only the memory need none of it.
WITHOUT_TIME_BOUND = ("from albert_jax import tpu_compile; import runpy; "
                      "assert callable(tpu_compile._report_time_bound); "
                      "tpu_compile._report_time_bound = lambda *args: None; "
                      "runpy.run_module('albert_jax.main', run_name='__main__', alter_sys=True)")


def compile_cli(*args, config="experiments/pretrain_tiny.py:synthetic", time_bound=True):
  """`--mode=compile` through the CLI: (the finished process, its JSON report or None). time_bound=False: the
  report's "time_bound" is None and its compile is skipped (`WITHOUT_TIME_BOUND`)."""
  main = ["-m", "albert_jax.main"] if time_bound else ["-c", WITHOUT_TIME_BOUND]
  cmd = [sys.executable, *main, f"--config={config}", "--mode=compile", *args]
  result = subprocess.run(cmd, cwd=REPO, env=compile_env(), capture_output=True, text=True, timeout=600)
  report = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
  return result, report


# ---------------------------------------------------------------------------------------------- the model

TINY_MODEL = model_config_for("tiny", vocab_size=97, max_position_embeddings=32)


def model_batch(config=TINY_MODEL, b=3, s=12, seed=0):
  """Random ids in `b` rows of `s` tokens, rows 1 and 2 padded from 7 and 4, two segments."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, config.vocab_size, (b, s)).astype(np.int32)
  mask = np.ones((b, s), np.int32)
  mask[1, 7:] = 0
  mask[2, 4:] = 0
  types = (np.arange(s)[None] >= s // 2).astype(np.int32).repeat(b, 0)
  return dict(input_ids=jnp.asarray(ids), attention_mask=jnp.asarray(mask), token_type_ids=jnp.asarray(types))


# ------------------------------------------------------------------------------------------ the data tools

TEXT = "".join(f"Document {i} begins.\nIts second sentence.\nAnd its last.\n\n" for i in range(20))


def data_cli_error(module: str, *args) -> str:
  """The message of a refused `python -m data_pipeline.<module>`: its last line on stderr (after any progress
  lines), exit status 1, no traceback."""
  result = subprocess.run([sys.executable, "-m", f"data_pipeline.{module}", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  prefix = f"data_pipeline.{module}: error: "
  last = result.stderr.splitlines()[-1]
  assert result.returncode == 1 and "Traceback" not in result.stderr and last.startswith(prefix), result.stderr
  return last[len(prefix):]


# -------------------------------------------------------------------------------------------- fine-tuning

GLUE_DIRS = {"cola": "CoLA", "sst-2": "SST-2", "mrpc": "MRPC", "sts-b": "STS-B", "rte": "RTE", "wnli": "WNLI",
             "qnli": "QNLI"}
TINY_RUN = ["--config.model.num_hidden_layers=2", "--config.data.max_seq_length=64",
            "--config.train.num_train_steps=4", "--config.train.global_batch_size=8",
            "--config.train.warmup_steps=1", "--config.train.eval_every=2", "--config.checkpoint.every=2",
            "--config.log.every=2", "--config.allow_random_init=True"]


def finetune_cli(config, workdir, *overrides, mode="train", extra=(), devices=1, wait=True, fast_compile=False):
  """`python -m albert_jax.main --mode=<mode>` of a fine-tuning config: the finished process, or (wait=False) the
  running one with stdout and stderr merged."""
  cmd = [sys.executable, "-m", "albert_jax.main", f"--config={config}", f"--workdir={workdir}", f"--mode={mode}",
         *overrides, *extra]
  env = cpu_env(devices, fast_compile)
  if not wait:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def spm(shared):
  """ALBERT's SentencePiece model in the shared data."""
  return shared / "albert_spm" / "spiece.model"


def head_lines(source: Path, target: Path, count: int) -> None:
  target.parent.mkdir(parents=True, exist_ok=True)
  lines = source.read_text(encoding="utf-8-sig").splitlines(keepends=True)
  target.write_text("".join(lines[:count]), encoding="utf-8")


def rte_pairs(shared, count):
  with open(shared / "glue" / "RTE" / "dev.tsv", encoding="utf-8") as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:count + 1]
  return [(r[1], r[2], r[3]) for r in rows]


def write_tsv(path: Path, header, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("\n".join("\t".join(map(str, r)) for r in [header, *rows]) + "\n", encoding="utf-8")


def glue_data(shared: Path, task: str, root: Path) -> Path:
  """A GLUE root with the task's folder: train (48 lines) and dev (24 lines). QQP and MNLI are not in the shared
  data: their files are written in the official column layouts from RTE sentence pairs."""
  if task in GLUE_DIRS:
    source = shared / "glue" / GLUE_DIRS[task]
    for split in ("train", "dev"):
      origin = source / f"{split}.tsv" if (source / f"{split}.tsv").exists() else source / "dev.tsv"
      head_lines(origin, root / GLUE_DIRS[task] / f"{split}.tsv", 48 if split == "train" else 24)
  elif task == "qqp":
    rows = [(i, 2 * i, 2 * i + 1, a, b, int(label == "entailment")) for i, (a, b, label) in
            enumerate(rte_pairs(shared, 72))]
    header = ("id", "qid1", "qid2", "question1", "question2", "is_duplicate")
    write_tsv(root / "QQP" / "train.tsv", header, rows[:48])
    write_tsv(root / "QQP" / "dev.tsv", header, rows[48:])
  elif task == "mnli":
    labels = ("entailment", "neutral", "contradiction")
    rows = [(i, i, f"{i}e", "fiction", "()", "()", "()", "()", a, b, lab, lab)
            for i, (a, b, lab) in enumerate((a, b, labels[i % 3]) for i, (a, b, _) in
                                             enumerate(rte_pairs(shared, 96)))]
    header = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label")
    write_tsv(root / "MNLI" / "train.tsv", header, rows[:48])
    write_tsv(root / "MNLI" / "dev_matched.tsv", header, rows[48:72])
    write_tsv(root / "MNLI" / "dev_mismatched.tsv", header, rows[72:])
  return root


def squad_data(shared: Path, root: Path, version: int) -> Path:
  """train/dev files cut from SQuAD v1.1 dev; for v2, questions paired with another article's paragraph are
  unanswerable (the null-answer path)."""
  articles = json.load(open(shared / "squad" / "dev-v1.1.json"))["data"]
  def cut(items, with_impossible):
    out = []
    for a_index, article in enumerate(items):
      paragraphs = [dict(p, qas=[dict(q, is_impossible=False) if version == 2 else q for q in p["qas"][:4]])
                    for p in article["paragraphs"][:2]]
      if with_impossible:
        other = items[(a_index + 1) % len(items)]["paragraphs"][0]
        paragraphs.append({"context": other["context"],
                           "qas": [dict(id=q["id"] + "_null", question=q["question"], answers=[], is_impossible=True)
                                   for q in article["paragraphs"][0]["qas"][:3]]})
      out.append({"title": article["title"], "paragraphs": paragraphs})
    return {"version": f"v{version}.{1 if version == 1 else 0}", "data": out}
  name = "v1.1" if version == 1 else "v2.0"
  root.mkdir(parents=True)
  json.dump(cut(articles[:3], version == 2), open(root / f"train-{name}.json", "w"))
  json.dump(cut(articles[3:5], version == 2), open(root / f"dev-{name}.json", "w"))
  return root


# ------------------------------------------------------------------------- your own classification data

SPLIT_WORDS = {"pos": ("good", "great", "fine"), "neg": ("bad", "awful", "dull")}


def write_split(path, count, labeled=True):
  """`count` rows "a <word> film" alternating pos and neg, with a `label` column unless labeled=False."""
  rows = [(f"a {SPLIT_WORDS[label][i % 3]} film", label) for i, label in zip(range(count), ["pos", "neg"] * count)]
  path.write_text("sentence" + ("\tlabel" if labeled else "") + "\n" +
                  "".join(text + (f"\t{label}" if labeled else "") + "\n" for text, label in rows))


def config_for(data, spm_model, labels=""):
  """A tiny 4-step classification config on `data` (as write_split writes it)."""
  from experiments import classification
  arg = f"size=tiny,data={data},spm={spm_model},text=sentence" + (f",labels={labels}" if labels else "")
  config = classification.get_config(arg)
  config.data.max_seq_length = 16
  config.allow_random_init = True
  config.train.update(num_train_steps=4, global_batch_size=8, warmup_steps=1, eval_every=2, micro_batch_size=0)
  config.checkpoint.every = 2
  config.log.every = 2
  return config


def quietly(fn, *args):
  """fn(*args) and what it printed."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    fn(*args)
  return out.getvalue()


def task_of(module, arg, **data):
  """The task of experiment `module`'s config for `arg`, at 32 tokens, with data.<key> = `data`."""
  from albert_jax.tasks import get_task
  config = module.get_config(arg)
  config.data.max_seq_length = 32
  config.data.update(data)
  return get_task(config)


# --------------------------------------------------------------------------------------------------- SQuAD

def squad_task(version, data="", **data_overrides):
  """The SQuAD task of the base config for `version` (1 or 2), reading `data`."""
  from albert_jax.tasks import get_task
  from experiments import common
  config = common.squad_config("base", version, str(data), "")
  config.data.update(data_overrides)
  return get_task(config)


def oracle_logits(split, answerable_null=-10.0):
  """+10 at the gold start/end of every window that holds the answer, -10 elsewhere; [CLS] gets +10 in the
  windows of unanswerable questions."""
  f = split.features
  start = np.full(f["input_ids"].shape, -10.0)
  end = start.copy()
  rows = np.arange(len(start))
  start[rows, f["start_positions"]] = 10.0
  end[rows, f["end_positions"]] = 10.0
  impossible = np.array([split.examples[i].is_impossible for i in split.info["example_index"]])
  start[~impossible, 0] = end[~impossible, 0] = answerable_null
  return {"start_logits": start, "end_logits": end}


def v2_dataset(squad_json, articles=4):
  """Answerable questions of the first articles, plus each of them asked again against a paragraph of the
  next article (unanswerable there)."""
  data = copy.deepcopy(squad_json["data"][:articles + 1])
  out = []
  for i in range(articles):
    article = data[i]
    donor = data[i + 1]["paragraphs"]
    extra = []
    for j, paragraph in enumerate(article["paragraphs"]):
      for qa in paragraph["qas"]:
        qa["is_impossible"] = False
      questions = [{"id": qa["id"] + "_neg", "question": qa["question"], "answers": [], "is_impossible": True}
                   for qa in paragraph["qas"]]
      extra.append({"context": donor[j % len(donor)]["context"], "qas": questions})
    out.append({"title": article["title"], "paragraphs": article["paragraphs"] + extra})
  return {"version": "v2.0", "data": out}
