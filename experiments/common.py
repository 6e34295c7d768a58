"""Shared building blocks of every experiment file (after big_vision `configs/common.py`).

A config has these sections:
  model      the ModelConfig fields (albert_jax/model_config.py), from a named size
  data       where examples come from and how they are built (data_pipeline/)
  train      optimizer, schedule, batch split, step counts
  mesh       device mesh shape and the logical-axis -> mesh-axis rules (albert_jax/sharding.py)
  checkpoint how often and how many checkpoints are kept
  log        metric and progress output
"""
from __future__ import annotations

import math
from typing import NamedTuple

import ml_collections

from albert_jax.errors import InputError
from albert_jax.model_config import MODEL_SIZES


# `:flag` alone means true; anything else must say yes or no (a typo such as `regression=ture` is refused).
BOOLEAN_WORDS = {"": True, "1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def parse_arg(arg: str | None, **defaults):
  """'size=large,smoke' -> ConfigDict(size='large', smoke=True), typed after `defaults`."""
  parsed, given = ml_collections.ConfigDict(dict(defaults)), set()
  for item in filter(None, (arg or "").split(",")):
    key, equals, value = item.partition("=")
    if key not in defaults:
      raise InputError(f"Unknown config argument {key!r}; valid: {sorted(defaults)}.")
    if key in given:  # refused rather than letting the last one win
      raise InputError(f"Config argument {key} is given twice in {arg!r}; keep one.")
    given.add(key)
    kind = type(defaults[key])
    if kind is not bool and not equals:
      raise InputError(f"Config argument {key!r} has no value; write {key}=VALUE.")
    if kind is bool:
      if value.lower() not in BOOLEAN_WORDS:
        raise InputError(f"Config argument {key}={value!r} is not a yes/no value; give {key}=true or {key}=false.")
      parsed[key] = BOOLEAN_WORDS[value.lower()]
    else:
      try:
        parsed[key] = kind(value)
      except ValueError:
        raise InputError(f"Config argument {key}={value!r} is not a{'n' if kind is int else ''} {kind.__name__}; "
                         f"e.g. {key}={defaults[key]!r}.") from None
  return parsed


RELEASES = ("v1", "v2")  # ALBERT's two releases: the paper's models and the longer-trained v2


def released_pretraining_config(size: str, arg: str | None) -> ml_collections.ConfigDict:
  """`pretraining_config` of the size's v2 model, or of its v1 with `version=v1`; any other version is refused."""
  version = parse_arg(arg, version="v2").version
  if version not in RELEASES:
    raise InputError(f"Config argument version={version!r} names no ALBERT release; choose one of {list(RELEASES)}.")
  return pretraining_config(size if version == "v2" else f"{size}_v1")


def model_config(size: str, **overrides) -> ml_collections.ConfigDict:
  if size not in MODEL_SIZES:
    raise InputError(f"Unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)}.")
  from albert_jax.model_config import ModelConfig, optional_field_types
  config = ml_collections.ConfigDict(ModelConfig(**{**MODEL_SIZES[size], **overrides}).to_dict())
  # A `X | None` field left at None has no type that `--config.model.x=value` could be parsed as: a placeholder of X
  # gives it one (its value stays None until overridden).
  for name, kind in optional_field_types().items():
    if config[name] is None:
      config[name] = ml_collections.config_dict.placeholder(kind)
  return config


def pretraining_config(size: str) -> ml_collections.ConfigDict:
  """The paper's pretraining recipe (batch 4096, seq 512, LAMB 0.00176, 125k steps, warmup 3125)."""
  c = ml_collections.ConfigDict()
  c.task = "pretrain"
  c.model_size = size
  # TPU recipe: bf16 compute (float32 params, LayerNorm and softmax), every activation kept: what `--mode=compile
  # --fit` chooses for each size's slice in the README (tests/test_tpu_compile.py; bench/tpu_recipes.py).
  c.model = model_config(size, dtype="bfloat16", remat_policy="none")
  c.seed = 0
  c.init_checkpoint = ""          # warm start (params only): a run, a convert output, an HF folder or Hub name
  c.init_checkpoint_revision = ""  # a Hugging Face Hub name's branch, tag or commit ("": main)
  c.compilation_cache_dir = ""    # persistent XLA cache; "" = workdir/compilation_cache, "none" = off
  c.resume_with_changes = False   # resume although seed, batch size, optimizer or data settings changed
  c.accept_changed_inputs = False  # read a run with a tokenizer or data whose bytes differ from what it recorded

  c.data = ml_collections.ConfigDict()
  c.data.kind = "prepared"        # "prepared" (data_pipeline.prepare output) | "synthetic" (benchmarks, smoke)
  c.data.path = ""                # directory written by `python -m data_pipeline.prepare`
  c.data.spm_model = ""           # optional: the model's tokenizer; data prepared with another is refused
  c.data.max_seq_length = 512
  c.data.max_predictions_per_seq = 20   # 0 = no budget: exactly masked_lm_prob of the tokens
  c.data.masked_lm_prob = 0.15
  c.data.short_seq_prob = 0.1
  c.data.short_seq_scope = "chunk"  # draw the short target per chunk; "document" = the original (data_pipeline.instances)
  c.data.ngram = 3
  c.data.favor_shorter_ngram = True
  c.data.sentence_task = "sop"    # "sop" | "nsp" | "none"
  c.data.packing = "segment_pairs"  # or "full_sentences": RoBERTa's packed sequences, sentence_task none (docs/data.md)
  c.data.masking = "dynamic"      # "dynamic" (fresh masks each epoch) | "static" (dupe_factor fixed copies)
  c.data.dupe_factor = 40
  c.data.num_workers = 0          # grain worker processes (0 = in the training process)
  c.data.prefetch = 2
  c.data.shuffle_buffer = 1024    # examples (from whole documents) shuffled together before batching

  c.train = ml_collections.ConfigDict()
  c.train.global_batch_size = 4096
  c.train.micro_batch_size = 0    # per data-parallel device per accumulation step; 0 = global / devices
  c.train.max_micro_batch_size = 0  # with micro_batch_size 0: the largest divisor of global / devices up to this
  c.train.num_train_steps = 125_000
  c.train.optimizer = "lamb"      # "lamb" (the original: no bias correction) | "optax_lamb" | "adamw"
  c.train.learning_rate = 0.00176
  c.train.warmup_steps = 3125
  c.train.poly_power = 1.0
  c.train.weight_decay = 0.01
  c.train.b1 = 0.9
  c.train.b2 = 0.999
  c.train.eps = 1e-6
  c.train.adam_bias_correction = False  # adamw only: True corrects its moments' bias (optax's and torch's AdamW)
  c.train.clip_grad_norm = 1.0
  c.train.eval_every = 5000
  c.train.eval_batches = 100

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))   # -1: all remaining devices
  c.mesh.dcn_shape = (("data", -1), ("fsdp", 1), ("tensor", 1))  # slices per axis (multislice); -1: all slices
  c.mesh.logical_axis_rules = (
      ("act_batch", ("data", "fsdp")),
      ("embed", "fsdp"),
      ("mlp", "tensor"),
      ("qkv", "tensor"),
      ("vocab", "tensor"),
  )

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 5000
  c.checkpoint.keep = 5
  c.checkpoint.async_save = True

  c.log = ml_collections.ConfigDict()
  c.log.every = 100
  c.log.profile_start = -1        # step at which to start a jax.profiler trace (-1 = never)
  c.log.profile_steps = 5
  c.log.wandb_project = ""        # Weights & Biases project ("" = off; pip install -e ".[wandb]"), docs/pretraining.md
  c.log.wandb_entity = ""         # W&B user or team ("" = your default entity)
  c.log.wandb_run_name = ""       # "" = the workdir's name
  c.log.wandb_tags = ""           # comma-separated, e.g. "base,seq512"
  return c


# --- Fine-tuning ------------------------------------------------------------------------------------------------
# Recipes of the original (google-research/albert): GLUE rows from `run_glue.sh` (all: --max_seq_length=512
# --optimizer=adamw --do_lower_case, every saved checkpoint evaluated); "eval_every" is its save interval.
# task: (learning_rate, warmup_steps, num_train_steps, global_batch_size, eval_every)
GLUE_RECIPES = {
    "cola": (1e-5, 320, 5336, 16, 100),
    "sst-2": (1e-5, 1256, 20935, 32, 100),
    "mrpc": (2e-5, 200, 800, 32, 100),
    "sts-b": (2e-5, 214, 3598, 16, 100),
    "qqp": (5e-5, 1000, 14000, 128, 100),
    "mnli": (3e-5, 1000, 10000, 128, 100),
    "qnli": (1e-5, 1986, 33112, 32, 200),
    "rte": (3e-5, 200, 800, 32, 100),
    # Not in run_glue.sh: the paper's appendix table of downstream hyperparameters (Lan et al. 2020, A.4).
    "wnli": (2e-5, 250, 2000, 16, 100),
}
# v2 large/xlarge diverge or stall at the recipes above (google-research/albert#197, deepset-ai/FARM#202;
# google-research/google-research#151: xlarge needs 5e-6). These caps are community findings, not a released
# recipe; override with --config.train.learning_rate.
V2_LEARNING_RATE_CAP = {"large": 1e-5, "xlarge": 5e-6}


def _is_v1(size: str) -> bool:
  return size.endswith("_v1")


def finetuning_config(size: str, task: str, task_name: str = "", data: str = "",
                      spm_model: str = "") -> ml_collections.ConfigDict:
  """The common fine-tuning setup on top of `pretraining_config`'s model/mesh/checkpoint/log/train sections.

  The original's AdamW (no bias correction, weight decay 0.01 except LayerNorm/bias, eps 1e-6, clip 1.0,
  linear warmup then linear decay) and its classifier dropout 0.1; the encoder keeps the released config's
  dropout (v2: 0, v1: 0.1), as `run_classifier.py` loads albert_config.json. The caller sets the recipe.
  """
  c = pretraining_config(size)
  c.task = task                   # "glue" | "squad_v1" | "squad_v2" | "race" (albert_jax.tasks.get_task)
  c.task_name = task_name         # GLUE sub-task, e.g. "sst-2"; "" otherwise
  c.init_checkpoint = ""          # pretrained weights: a pretraining workdir, a convert output, an HF folder or Hub name
  c.allow_random_init = False     # an empty init_checkpoint is an error unless this is True (#132: F1 16)
  c.classifier_dropout_prob = 0.1  # on the pooled vector (GLUE, RACE); hard-coded 0.1 in the original
  c.classifier_head = "auto"      # GLUE/own classification: albert | electra | bert | roberta; auto: the weights'

  c.model.dtype = "float32"       # fine-tuning keeps full precision and every activation (short runs)
  c.model.remat_policy = "none"
  c.data = ml_collections.ConfigDict()
  c.data.path = data              # the task's data folder (docs/finetuning.md lists the expected files)
  c.data.spm_model = spm_model    # SentencePiece model of the checkpoint (ALBERT: spiece.model / 30k-clean.model)
  c.data.do_lower_case = True     # ALBERT's English models are uncased
  c.data.max_seq_length = 512
  c.data.length_buckets = "64,128,256,512"  # batches cut to the shortest holding them; "none": max_seq_length

  c.train.optimizer = "adamw"
  c.train.weight_decay = 0.01
  c.train.eps = 1e-6
  c.train.clip_grad_norm = 1.0
  c.train.poly_power = 1.0
  c.train.eval_batches = 0        # pretraining's held-out batches; fine-tuning scores whole dev splits
  c.train.early_stopping_patience = 0  # dev evaluations without a new best before training stops; 0: off
  c.train.layerwise_lr_decay = 0.0  # lr x decay^(L + 2 - depth) per layer (albert_jax/optim.py); 0: off
  return c


# Tokens per device in one micro step that each size fine-tunes within a device of 16 GiB (TPU v3; the original
# fine-tuned on 8 cores, num_tpu_cores=8) in float32 without remat, with 10% of it to spare: measured with
# `--mode=compile --topology=v3-8 --fit` (bench/tpu_recipes.py, rows finetune_*); LayerNorm, GELU and the softmax
# keep one array each for the backward (albert_jax/ops.py). A bigger device may take more:
# --config.train.max_micro_batch_size=0 lifts the cap.
FINETUNE_TOKENS_PER_DEVICE = {"base": 8192, "large": 4096, "xlarge": 2048, "xxlarge": 1024}


def cap_micro_batch(c: ml_collections.ConfigDict, sequences_per_example: int) -> None:
  """Caps the per-device micro batch to the size's token budget (more accumulation steps, the same update); an
  example longer than the budget (RACE's 4 × 512 tokens at xlarge and xxlarge) keeps only the matmuls' outputs.
  Both follow the run's own data.max_seq_length: they are ml_collections references computed when the config is
  read, after the command line's overrides and the cap at the weights' max_position_embeddings
  (`weights.record.take_recorded`); an explicit --config.train.max_micro_batch_size or model.remat_policy wins."""
  budget = FINETUNE_TOKENS_PER_DEVICE.get(c.model_size.removesuffix("_v1").removesuffix("_v2"))
  if budget is None:
    return
  tokens = c.data.get_ref("max_seq_length") * sequences_per_example
  c.train.max_micro_batch_size = tokens._apply_op(lambda n: max(1, budget // n))  # pylint: disable=protected-access
  c.model.remat_policy = tokens._apply_op(  # pylint: disable=protected-access
      lambda n: "dots_saveable" if n > budget else "none").to_str()


def set_recipe(c: ml_collections.ConfigDict, learning_rate: float, warmup_steps: int, num_train_steps: int,
               global_batch_size: int, eval_every: int, sequences_per_example: int = 1) -> ml_collections.ConfigDict:
  """Fills the schedule and caps the micro batch (see FINETUNE_TOKENS_PER_DEVICE); v2 large/xlarge learning rates
  are capped (see V2_LEARNING_RATE_CAP)."""
  cap_micro_batch(c, sequences_per_example)
  if not _is_v1(c.model_size):
    learning_rate = min(learning_rate, V2_LEARNING_RATE_CAP.get(c.model_size.removesuffix("_v2"), learning_rate))
  return _schedule(c, learning_rate, warmup_steps, num_train_steps, global_batch_size, eval_every)


def _schedule(c: ml_collections.ConfigDict, learning_rate: float, warmup_steps: int, num_train_steps: int,
              global_batch_size: int, eval_every: int) -> ml_collections.ConfigDict:
  c.train.learning_rate = learning_rate
  c.train.warmup_steps = warmup_steps
  c.train.num_train_steps = num_train_steps
  c.train.global_batch_size = global_batch_size
  c.train.eval_every = eval_every   # checkpoint-selection interval: evaluate dev, keep the best
  c.checkpoint.every = eval_every
  return c


class Recipe(NamedTuple):
  """One task's published fine-tuning recipe: its schedule in epochs and its optimiser's settings (AdamW)."""
  learning_rate: float
  batch: int
  epochs: int
  max_seq_length: int
  warmup_percent: int = 10          # of the steps, rounded down
  weight_decay: float = 0.01
  b2: float = 0.999
  adam_bias_correction: bool = False  # True: fairseq's and torch's Adam; False: BERT's and ELECTRA's (no correction)
  clip_grad_norm: float = 1.0       # 0: no clipping
  layerwise_lr_decay: float = 0.0


# Training examples per task: the rows of GLUE's train.tsv; SQuAD's questions (about one 512-token window each);
# RACE's questions (train/middle and train/high).
TRAIN_EXAMPLES = {"cola": 8551, "sst-2": 67349, "mrpc": 3668, "sts-b": 5749, "qqp": 363846, "mnli": 392702,
                  "qnli": 104743, "rte": 2490, "wnli": 635, "squad_v1": 87599, "squad_v2": 130319, "race": 87866}
SQUAD_TASKS = ("squad_v1", "squad_v2")
GLUE_TASKS = tuple(GLUE_RECIPES)

# ELECTRA's (Clark et al. 2020, appendix table; google-research/electra `configure_finetuning.py`): batch 32, 10%
# warmup, 3 epochs (10 for RTE and STS-B, 2 for SQuAD), GLUE at 128 tokens and SQuAD at 512.
# recipe: (learning_rate, layerwise_lr_decay)
ELECTRA_RECIPES = {"electra_small": (3e-4, 0.8), "electra_base": (1e-4, 0.8), "electra_large": (5e-5, 0.9)}
ELECTRA_EPOCHS = {"rte": 10, "sts-b": 10, "squad_v1": 2, "squad_v2": 2}  # every other task: 3

# RoBERTa's (Liu et al. 2019, Table 10: 10 epochs on GLUE, 4 on RACE, 2 on SQuAD; 6% warmup, linear decay) with
# fairseq's Adam (bias-corrected, β2 0.98, ε 1e-6, no clipping). GLUE's per-task learning rate and batch are those
# of fairseq's `examples/roberta/README.glue.md` (its rows of the Table 10 grid); RACE's and SQuAD's are Table 10's,
# which gives no SQuAD length (384 here, as ALBERT's and BERT's) and no WNLI row (the paper ranks WNLI's candidates).
ROBERTA_GLUE = {"mnli": (1e-5, 32), "qnli": (1e-5, 32), "qqp": (1e-5, 32), "sst-2": (1e-5, 32),
                "rte": (2e-5, 16), "sts-b": (2e-5, 16), "mrpc": (1e-5, 16), "cola": (1e-5, 16)}
ROBERTA_EVERY_TASK = dict(warmup_percent=6, b2=0.98, adam_bias_correction=True, clip_grad_norm=0.0)

# task -> Recipe for every published recipe but ALBERT's (GLUE_RECIPES and the configs' own figures).
FINETUNING_RECIPES = {
    **{name: {task: Recipe(learning_rate, 32, ELECTRA_EPOCHS.get(task, 3), 512 if task in SQUAD_TASKS else 128,
                           layerwise_lr_decay=decay) for task in (*GLUE_TASKS, *SQUAD_TASKS)}
       for name, (learning_rate, decay) in ELECTRA_RECIPES.items()},
    "roberta": {**{task: Recipe(learning_rate, batch, 10, 512, weight_decay=0.1, **ROBERTA_EVERY_TASK)
                   for task, (learning_rate, batch) in ROBERTA_GLUE.items()},
                "race": Recipe(1e-5, 16, 4, 512, weight_decay=0.1, **ROBERTA_EVERY_TASK),
                **{task: Recipe(1.5e-5, 48, 2, 384, **ROBERTA_EVERY_TASK) for task in SQUAD_TASKS}},
    # BERT's (Devlin et al. 2019, section 4.1; google-research/bert `run_classifier.py`, `optimization.py`): 3 epochs
    # at batch 32 and 128 tokens, 10% warmup, its AdamW without bias correction; 2e-5 of the paper's grid
    # {5e-5, 4e-5, 3e-5, 2e-5}. SQuAD: its README's v1.1 base command (lr 3e-5, batch 12, 2 epochs, 384 tokens, stride
    # 128), also for v2.0. The paper leaves WNLI out and has no RACE.
    "bert": {**{task: Recipe(2e-5, 32, 3, 128) for task in GLUE_TASKS if task != "wnli"},
             **{task: Recipe(3e-5, 12, 2, 384) for task in SQUAD_TASKS}},
}
RECIPES = ("albert", *FINETUNING_RECIPES)  # "albert": the original ALBERT recipes above (run_glue.sh, the README's)


def check_recipe(recipe: str) -> str:
  if recipe not in RECIPES:
    raise InputError(f"Config argument recipe={recipe!r}; choose one of {list(RECIPES)}.")
  return recipe


def published_recipe(c: ml_collections.ConfigDict, recipe: str, task: str,
                     sequences_per_example: int = 1) -> ml_collections.ConfigDict:
  """Recipe `recipe` of FINETUNING_RECIPES for `task` (a key of TRAIN_EXAMPLES): its epochs at its batch as steps
  (rounded up), dev scored at each tenth of them (the best kept), its sequence length and optimiser settings."""
  published = FINETUNING_RECIPES[recipe].get(task)
  if published is None:
    covered = [name for name, tasks in FINETUNING_RECIPES.items() if task in tasks]
    raise InputError(f"Config argument recipe={recipe} has no published figures for {task}; choose one of "
                     f"{['albert', *covered]}.")
  steps = math.ceil(published.epochs * TRAIN_EXAMPLES[task] / published.batch)
  c.data.max_seq_length = published.max_seq_length
  for field in ("weight_decay", "b2", "adam_bias_correction", "clip_grad_norm", "layerwise_lr_decay"):
    c.train[field] = getattr(published, field)
  cap_micro_batch(c, sequences_per_example)
  return _schedule(c, published.learning_rate, steps * published.warmup_percent // 100, steps, published.batch,
                   math.ceil(steps / 10))


def squad_config(size: str, version: int, data: str, spm_model: str,
                 recipe: str = "albert") -> ml_collections.ConfigDict:
  """The README's run_squad_v1/v2 commands: msl 384, doc_stride 128, max_query 64, batch 48, lr 5e-5,
  2 epochs with 10% warmup, n_best 20, max_answer 30; only the final checkpoint is evaluated there
  (save_checkpoints_steps=5000 > steps). Another `recipe` replaces the length, schedule and optimiser settings
  (`published_recipe`)."""
  c = finetuning_config(size, f"squad_v{version}", data=data, spm_model=spm_model)
  c.data.max_seq_length = 384
  c.data.doc_stride = 128         # tokens between the starts of consecutive context windows
  c.data.max_query_length = 64    # question tokens kept (the first ones)
  c.data.max_answer_length = 30   # longest predicted answer, in tokens
  c.data.n_best_size = 20         # start and end candidates per window
  c.data.null_score_diff_threshold = 0.0  # v2: answer "" when null_odds > this (tune on dev: best_f1_thresh)
  if version == 2:
    c.data.v2_head = "null_score"  # "null_score" (BERT's) | "answer_class" (the original's beam + class head)
    c.data.start_n_top = 5         # answer_class: starts in the beam
    c.data.end_n_top = 5           # answer_class: ends kept per start
  # 2 epochs of the train windows: v1.1 3649 steps (= the paper's count, 87.6k questions -> ~88.6k windows);
  # v2.0 ~5500 (130.3k questions -> ~132k windows; for the exact count use ceil(2 * windows / 48)).
  if recipe in FINETUNING_RECIPES:
    return published_recipe(c, recipe, c.task)
  steps = 3649 if version == 1 else 5500
  return set_recipe(c, 5e-5, steps // 10, steps, 48, eval_every=steps)


def own_data_config(size: str, task: str, data: str, spm_model: str, max_seq_length: int, learning_rate: float,
                    batch: int, labels: str = "", **data_fields) -> ml_collections.ConfigDict:
  """Your own data (classification, token_classification, multiple_choice): transformers' example defaults
  rather than a paper recipe. 1000 steps with 10% warmup, dev scored every 100: set train.num_train_steps to
  about 3 epochs of your train file (examples / batch × 3). `labels` is "a|b|c" (empty: from the train file)."""
  c = finetuning_config(size, task, data=data, spm_model=spm_model)
  c.data.max_seq_length = max_seq_length
  c.data.labels = tuple(filter(None, labels.split("|")))
  c.data.update(data_fields)
  return set_recipe(c, learning_rate, 100, 1000, batch, eval_every=100,
                    sequences_per_example=data_fields.get("num_choices", 1))
