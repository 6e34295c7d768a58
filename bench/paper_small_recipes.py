"""`python -m bench.paper_small_recipes --scale=cpu`: ELECTRA's and RoBERTa's claims at the scale of bench.paper_small
(docs/paper_small_scale.md), with its runs, records and tables.

1. `electra`, ELECTRA's Table 1 (Clark et al. 2020): the generator-discriminator pair against MLM alone on the
   discriminator's model (the study's L and H, its baseline's E, no sharing, exact GELU, single-token masking, the
   same optimizer) at equal pretraining FLOPs, the generator's counted: the pair trains the scale's steps and the
   MLM run the steps whose FLOPs match them (`albert_jax.flops`, as the runs' MFU counts them).
2. `roberta`, RoBERTa's Table 2 (Liu et al. 2019, no NSP ≥ with NSP): its recipe (E = H, no sharing, no sentence
   task, FULL-SENTENCES packing, AdamW β2 0.98, ε 1e-6, no clipping) against ALBERT's SOP baseline of the study,
   the scale's steps each.
Every row is fine-tuned on SST-2, MRPC and RTE (the scale's transfer tasks but STS-B), over the scale's seeds, at each
of its `Settings.finetune_learning_rates`; a cell is the rate with the better median. Runs
go through bench.paper_small's driver: a workdir each under --root, a record once done, a rerun resumes. The
report adds a `recipes` entry to bench.paper_small's JSON at this scale (its other entries kept) and rewrites this
module's section of the doc; `--report_only` does only that.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
from typing import Any

from bench import common
from bench import paper_small as ps

MODULE = "bench.paper_small_recipes"


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the two recipes set at a scale beyond its `paper_small.Scale` (docs/paper_small_scale.md: how chosen)."""
  generator_fraction: float       # the ELECTRA generator's width, of the discriminator's
  electra_optimizer: str          # the pair's and its MLM twin's, with ELECTRA's β2 0.999, ε 1e-6, weight decay 0.01
  electra_learning_rate: float
  roberta_learning_rate: float    # AdamW, RoBERTa's β2 0.98, ε 1e-6, weight decay 0.01
  # Every row is fine-tuned at each; its cells are its best rate's (`paper_small.Table.learning_rates`). Empty: the
  # scale's `finetune_learning_rate` alone.
  finetune_learning_rates: tuple[float, ...] = ()


SETTINGS = {"cpu": Settings(0.25, "lamb", 1e-2, 1e-3, finetune_learning_rates=(3e-4, 1e-4)),
            "gpu": Settings(0.25, "adamw", 1e-3, 1e-3),   # not calibrated, as the gpu scale
            "toy": Settings(0.5, "lamb", 5e-3, 1e-3)}     # H=32, two heads: a generator of one head, H=16


@dataclasses.dataclass(frozen=True)
class RecipeRun(ps.Pretraining):
  """A pretraining run of another recipe on the study's model: `recipe_name` is electra, mlm (the pair's MLM-only
  twin) or roberta; `train_steps` 0 is the scale's."""
  recipe_name: str = "mlm"
  settings: Settings = SETTINGS["cpu"]
  train_steps: int = 0

  @property
  def name(self) -> str:
    """With what sets its steps: the pair's generator width (g4: a quarter) and the twin's steps."""
    generator = f"_g{1 / self.settings.generator_fraction:g}" if self.recipe_name == "electra" else ""
    steps = f"_{self.train_steps}steps" if self.train_steps else ""
    return f"{self.recipe_name}_e{self.embedding_size}{generator}{steps}"

  def steps(self, scale: ps.Scale) -> int:
    return self.train_steps or scale.steps

  def learning_rate(self, scale: ps.Scale) -> float:
    s = self.settings
    return s.roberta_learning_rate if self.recipe_name == "roberta" else s.electra_learning_rate

  def config_args(self, scale: ps.Scale) -> list[str]:
    if self.recipe_name == "roberta":
      # The study's model as recorded: positions from row 0, the tanh GELU and eps 1e-12 of its other runs.
      return ["--config=experiments/pretrain_roberta.py:size=tiny", "--config.model.position_offset=0",
              "--config.model.hidden_act=gelu_new", "--config.model.layer_norm_eps=1e-12",
              f"--config.model.embedding_size={self.embedding_size}", "--config.train.optimizer=adamw",
              "--config.train.b1=0.9", "--config.train.b2=0.98", "--config.train.eps=1e-06",
              "--config.train.weight_decay=0.01", "--config.train.clip_grad_norm=0.0"]
    optimizer = [f"--config.train.optimizer={self.settings.electra_optimizer}", "--config.train.b2=0.999",
                 "--config.train.eps=1e-06", "--config.train.weight_decay=0.01"]
    if self.recipe_name == "electra":
      return [f"--config=experiments/pretrain_electra.py:size=tiny,sharing=none,embedding_size={self.embedding_size}",
              f"--config.electra.generator_fraction={self.settings.generator_fraction}", *optimizer]
    return [f"--config=experiments/ablation.py:size=tiny,embedding_size={self.embedding_size},sharing=none,"   # mlm
            "sentence_task=none", "--config.model.hidden_act=gelu", "--config.data.ngram=1", *optimizer]

  def held_out_tasks(self) -> tuple[str, ...]:
    return ("none",)


def finetune_tasks(scale: ps.Scale) -> tuple[str, ...]:
  return tuple(t for t in scale.transfer_tasks if t != "sts-b")


def learning_rates(scale: ps.Scale) -> tuple[float, ...]:
  """The fine-tuning rates of `Settings`, as `paper_small.Finetuning` names them (0: the scale's own)."""
  rates = SETTINGS[scale_name(scale)].finetune_learning_rates or (scale.finetune_learning_rate,)
  return tuple(0.0 if rate == scale.finetune_learning_rate else rate for rate in rates)


def flops_per_token(study: ps.Study, run: ps.Pretraining) -> float:
  """Training FLOPs per token of the run's config, as its job counts them (ELECTRA: both towers)."""
  from albert_jax import job_kinds
  config = ps.experiment_config(study, run)
  return job_kinds.kind_for(config).make_job(config).flops_per_token


def train_flops(study: ps.Study, run: ps.Pretraining) -> float:
  return flops_per_token(study, run) * study.scale.batch * study.scale.seq_len * run.steps(study.scale)


@functools.cache
def pretraining_runs(scale_name: str) -> tuple[RecipeRun, RecipeRun, RecipeRun]:
  """(the ELECTRA pair, its MLM twin at the steps of equal FLOPs, the RoBERTa run); the FLOPs are counted from
  the command lines, whose paths do not change them."""
  scale, settings = ps.SCALES[scale_name], SETTINGS[scale_name]
  electra = RecipeRun(scale.embedding_size, sharing="none", sentence_task="none", recipe_name="electra",
                      settings=settings)
  mlm = dataclasses.replace(electra, recipe_name="mlm")
  study = ps.Study(scale, "", "", "")
  twin_steps = round(train_flops(study, electra) / (train_flops(study, mlm) / scale.steps))
  roberta = dataclasses.replace(electra, recipe_name="roberta", embedding_size=scale.hidden_size)
  return electra, dataclasses.replace(mlm, train_steps=twin_steps), roberta


def scale_name(scale: ps.Scale) -> str:
  return next(name for name, s in ps.SCALES.items() if s == scale)


def plan(scale: ps.Scale) -> list[ps.Pretraining | ps.Finetuning]:
  """The order that gives a first comparison early: the ELECTRA pair and its twin, each fine-tuned on the first
  task, then the other tasks; then the SOP baseline and RoBERTa, likewise; then each other fine-tuning rate's runs
  in the same order."""
  electra, mlm, roberta = pretraining_runs(scale_name(scale))
  tasks, seeds = finetune_tasks(scale), range(scale.seeds)
  pairs = ((electra, mlm), (ps.baseline(scale), roberta))
  rate, *other_rates = learning_rates(scale)
  runs = []
  for pair in pairs:
    runs += [pair[0], *(ps.Finetuning(pair[0].name, tasks[0], s, rate) for s in seeds), pair[1],
             *(ps.Finetuning(pair[1].name, tasks[0], s, rate) for s in seeds)]
    runs += [ps.Finetuning(run.name, t, s, rate) for t in tasks[1:] for run in pair for s in seeds]
  return runs + [ps.Finetuning(run.name, t, s, r) for r in other_rates for pair in pairs for t in tasks
                 for run in pair for s in seeds]


PAPER = {   # ELECTRA's Table 1 (GLUE dev score, the same compute); RoBERTa's Table 2 (BERT-base size)
    "electra": {"mlm": {"glue": 75.1}, "electra": {"glue": 79.9}},
    "roberta": {"sop": {"sst-2": 92.9, "mnli": 84.0, "avg": 82.0},            # SEGMENT-PAIR + NSP
                "roberta": {"sst-2": 92.5, "mnli": 84.7, "avg": 82.3}},       # FULL-SENTENCES
}
# Our task -> the paper's figure it is compared with: ELECTRA's GLUE score; RoBERTa's own SST-2, MNLI for RTE (both
# inference), and for MRPC the mean of its five (SQuAD 1.1/2.0, MNLI-m, SST-2, RACE).
PAPER_MEASURES = {"electra": {"sst-2": "glue", "mrpc": "glue", "rte": "glue"},
                  "roberta": {"sst-2": "sst-2", "mrpc": "avg", "rte": "mnli"}}


def tables(scale: ps.Scale) -> list[ps.Table]:
  electra, mlm, roberta = pretraining_runs(scale_name(scale))
  base, tasks, rates = ps.baseline(scale), finetune_tasks(scale), learning_rates(scale)
  settings = SETTINGS[scale_name(scale)]
  return [
      ps.Table("electra", f"ELECTRA's Table 1 at equal pretraining FLOPs (L={scale.num_hidden_layers}, "
               f"H={scale.hidden_size}, E={scale.embedding_size}, not shared; generator "
               f"×{settings.generator_fraction:g})",
               {"mlm": (f"MLM only, {mlm.steps(scale)} steps", mlm.name),
                "electra": (f"ELECTRA, {electra.steps(scale)} steps", electra.name)}, ("flops", *tasks), rates),
      ps.Table("roberta", "RoBERTa's recipe against ALBERT's SOP baseline (paper: RoBERTa's Table 2, with NSP "
               "against FULL-SENTENCES)",
               {"sop": (f"ALBERT, SOP ({base.name})", base.name),
                "roberta": (f"RoBERTa, FULL-SENTENCES ({roberta.name})", roberta.name)}, ("params", "mlm", *tasks),
               rates),
  ]


def report(args: argparse.Namespace, study: ps.Study) -> dict[str, Any]:
  """The `recipes` entry of the JSON (its other entries kept) and this module's section of the doc."""
  records, runs = ps.read_records(study), plan(study.scale)
  pretraining = [run for run in runs if isinstance(run, ps.Pretraining)]
  flops = {run.name: {"per_token": flops_per_token(study, run), "steps": run.steps(study.scale),
                      "total": train_flops(study, run)} for run in pretraining}
  counts = {"params": {run.name: ps.backbone_params(study, run) for run in pretraining},
            "flops": {name: f["total"] for name, f in flops.items()}}
  payload = {"scale": args.scale, "settings": dataclasses.asdict(SETTINGS[args.scale]), "root": study.root,
             "corpus": study.corpus, "runs_total": len(runs), "runs_done": len(records),
             "wall_s_done": sum(r["wall_s"] for r in records.values()), "flops": flops,
             "tables": ps.build_tables(study.scale, records, counts, tables(study.scale), PAPER, PAPER_MEASURES),
             "runs": {r.name: records.get(r.name, {"status": "pending"}) for r in runs},
             "commands": {r.name: "python -m albert_jax.main " + " ".join(study.argv(r)) for r in runs},
             "environment": common.environment(MODULE)}
  common.write_shared_json(args.results, {"recipes": payload}, keep=lambda key: key != "recipes")
  common.write_doc_section(args.doc, f"{MODULE} {args.scale}", markdown(args.scale, payload))
  print(f"wrote {args.results} (its `recipes`) and {args.doc}: {len(records)} of {len(runs)} runs done", flush=True)
  return payload


def markdown(scale: str, payload: dict[str, Any]) -> str:
  lines = [f"Scale `{scale}`, corpus: {payload['corpus']}; {payload['runs_done']} of {payload['runs_total']} runs "
           f"done, {payload['wall_s_done'] / 3600:.2f} h of runs",
           f"(regenerate: `python -m {MODULE} --scale={scale} --root={payload['root']} --report_only`).", "",
           "| pretraining run | FLOPs per token | steps | pretraining FLOPs |", "|---|---|---|---|"]
  lines += [f"| {name} | {f['per_token']:,.0f} | {f['steps']:,} | {f['total']:.3g} |"
            for name, f in payload["flops"].items()]
  for table in payload["tables"].values():
    lines += ps.table_lines(table)
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """bench.paper_small's command line (`--tables`: electra, roberta) on this module's runs and tables; a root may
  be the other study's, whose SOP baseline it then shares."""
  return ps.main(argv, plan, tables, report)


if __name__ == "__main__":
  main()
