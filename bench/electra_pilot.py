"""`python -m bench.electra_pilot`: the ELECTRA pair of bench.paper_small_recipes at the cpu scale (L=4, H=192,
E=128, not shared, generator ×1/4, seq 64, batch 32, warmup 120, a 2,400-step schedule, its corpus and tokenizer)
with the bias-corrected AdamW (`train.adam_bias_correction`, torch's AdamW) at 5e-4, and the same with a lower
generator rate (`electra.generator_lr_multiplier`), scored on held-out batches at steps 100 to 2,400: the
discriminator's loss against chance (the loss of one that knows only the replaced share), its ROC-AUC over the
tokens that are not [CLS] or [SEP], and the generator's MLM accuracy (docs/paper_small_scale.md).

Each variant is one `python -m albert_jax.main` run under --root (bench.paper_small's driver: its log in ROOT/logs, a
rerun resumes it), a checkpoint every 100 steps, all kept; then its milestone checkpoints are scored in this process
on the study's held-out batches, the generator sampling with the same key per batch at every step. A Ctrl-C stops a
run at its step; `--score_only` scores whatever checkpoints the runs have. Prints a table, writes the JSON
(bench/results/electra_pilot_cpu.json) and this module's section of the doc.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import tempfile
from typing import Any

import numpy as np

from bench import common
from bench import paper_small as ps
from bench import paper_small_recipes as recipes

MODULE = "bench.electra_pilot"
MILESTONES = (100, 200, 400, 800, 1600, 2400)
CHECKPOINT_EVERY = 100
SETTINGS = dataclasses.replace(recipes.SETTINGS["cpu"], electra_optimizer="adamw", electra_learning_rate=5e-4)


@dataclasses.dataclass(frozen=True)
class PilotRun(recipes.RecipeRun):
  """The study's ELECTRA pair with the bias-corrected AdamW of `SETTINGS` and a generator learning-rate factor."""
  recipe_name: str = "electra"
  settings: recipes.Settings = SETTINGS
  generator_lr_multiplier: float = 1.0

  @property
  def name(self) -> str:
    return f"electra_adamw_bc_{self.settings.electra_learning_rate:g}_generator_x{self.generator_lr_multiplier:g}"

  def config_args(self, scale: ps.Scale) -> list[str]:
    return [*super().config_args(scale), "--config.train.adam_bias_correction=True",
            f"--config.electra.generator_lr_multiplier={self.generator_lr_multiplier}"]


VARIANTS = {"bc": PilotRun(128, sharing="none", sentence_task="none"),
            "bc_generator_x0.25": PilotRun(128, sharing="none", sentence_task="none", generator_lr_multiplier=0.25)}


class PilotStudy(ps.Study):
  """The study's command lines with a checkpoint at every 100 steps, all kept, and one held-out evaluation, at the
  end (the milestones are scored here)."""

  def argv(self, run: ps.Pretraining | ps.Finetuning) -> list[str]:
    steps = run.steps(self.scale)
    return [*super().argv(run), f"--config.checkpoint.every={CHECKPOINT_EVERY}",
            f"--config.checkpoint.keep={steps // CHECKPOINT_EVERY + 1}", f"--config.train.eval_every={steps}"]


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
  """The probability that a random positive scores above a random negative, ties counting half (Mann–Whitney)."""
  _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
  ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]   # 1-based, tied scores sharing their mean rank
  positive = labels.astype(bool)
  n_pos, n_neg = int(positive.sum()), int((~positive).sum())
  return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def score(study: ps.Study, run: PilotRun, steps: tuple[int, ...]) -> list[dict[str, float]]:
  """The held-out scores of each of `steps` that the run has a checkpoint for."""
  import jax
  from albert_jax import checkpointing, engine, metrics as metrics_lib
  from albert_jax.families import electra_pretraining as electra
  from albert_jax.run import Run
  from data_pipeline.tokenization import Tokenizer
  config = ps.experiment_config(study, run)
  tokenizer = Tokenizer(study.spm_model)
  weight, model = config.electra.discriminator_weight, electra.make_model(config)
  workdir = Run(study.workdir(run.name))
  s = engine.setup(config, electra.make_job(config, workdir))
  ckpt = checkpointing.Checkpointer(workdir.checkpoints, 1, 1)
  batches = list(itertools.islice(s.job.batches("eval", s.split), config.train.eval_batches))
  forward = jax.jit(lambda params, batch, rng: electra.electra_forward(model, params, batch, rng, deterministic=True))
  rows = []
  for step in (step for step in steps if step in ckpt.all_steps()):
    with s.context():
      params = s.replicate(ckpt.restore_params(step))
      sums, scores, labels = {}, [], []
      for i, host_batch in enumerate(batches):
        batch = s.global_batch(host_batch)
        mlm_logits, disc_logits, replaced = forward(params, batch, jax.random.key(i))
        _, batch_sums = electra.electra_objective(mlm_logits, disc_logits, replaced, batch,
                                                  electra.electra_totals(batch), weight)
        sums = metrics_lib.add(sums, metrics_lib.fetch(batch_sums))
        kept = (host_batch["attention_mask"] > 0) & ~np.isin(host_batch["input_ids"],
                                                             (tokenizer.cls_id, tokenizer.sep_id))
        scores.append(np.asarray(disc_logits)[kept])
        labels.append(np.asarray(replaced)[kept])
    m = electra.summarize_electra(weight, sums)
    rows.append({"step": step, "generator_accuracy": m["mlm_accuracy"], "generator_loss": m["mlm_loss"],
                 "disc_loss": m["disc_loss"], "disc_chance_loss": m["disc_chance_loss"],
                 "below_chance": 1 - m["disc_loss"] / m["disc_chance_loss"],
                 "roc_auc": roc_auc(np.concatenate(scores), np.concatenate(labels)),
                 "disc_precision": m["disc_precision"], "disc_recall": m["disc_recall"]})
    print(f"{run.name} step {step}: {rows[-1]}", flush=True)
  return rows


def markdown(payload: dict[str, Any]) -> str:
  lines = [f"Scale `cpu`, corpus: {payload['corpus']}; held-out: {payload['eval_examples']:,} sequences "
           f"(regenerate: `python -m {MODULE} --root={payload['root']} --score_only`).", "",
           "| run | step | generator MLM acc. | disc. loss / chance | below chance | ROC-AUC | precision / recall |",
           "|---|---|---|---|---|---|---|"]
  for name, record in payload["runs"].items():
    for i, r in enumerate(record["scores"]):
      lines.append(f"| {name if i == 0 else ''} | {r['step']:,} | {r['generator_accuracy']:.1%} | "
                   f"{r['disc_loss']:.4f} / {r['disc_chance_loss']:.4f} | {r['below_chance']:.1%} | "
                   f"{r['roc_auc']:.3f} | {r['disc_precision']:.3f} / {r['disc_recall']:.3f} |")
  return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "albert_electra_pilot"),
                 help="the runs' workdirs, logs and data; rerunning resumes there")
  p.add_argument("--shared_data", default=os.environ.get("ALBERT_JAX_SHARED_DATA",
                                                         os.path.join(os.path.dirname(ps.REPO), "shared", "data")),
                 help="the folder with corpus/ (without it: the bundled corpus, said in the table)")
  p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
  p.add_argument("--score_only", action="store_true", help="score the runs' checkpoints; train nothing")
  p.add_argument("--results", default=os.path.join(common.RESULTS_DIR, "electra_pilot_cpu.json"))
  p.add_argument("--doc", default=os.path.join(ps.REPO, "docs", "paper_small_scale.md"),
                 help="the markdown file whose section for this module is rewritten")
  args = p.parse_args(argv)
  args.root = os.path.abspath(args.root)
  return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
  from albert_jax import console
  console.install()
  args = parse_args(argv)
  scale = ps.SCALES["cpu"]
  files, corpus = ps.corpus_files(scale, args.shared_data)
  study = PilotStudy(scale, args.root, "", corpus)
  runs = {VARIANTS[v].name: VARIANTS[v] for v in args.variants.split(",")}
  if not args.score_only:
    ps.prepare_data(study, files)
  for run in runs.values():   # every run first: the scoring comes after, and a rerun of this command redoes it
    if not args.score_only and not os.path.isfile(study.record_path(run.name)):
      common.write_json_file(study.record_path(run.name), ps.launch(study, run))
  payload = {"scale": "cpu", "corpus": corpus, "root": study.root, "milestones": MILESTONES,
             "eval_examples": scale.eval_batches * scale.batch, "settings": dataclasses.asdict(SETTINGS), "runs": {},
             "environment": common.environment(MODULE)}
  for name, run in runs.items():
    if not os.path.isdir(study.workdir(name)):
      continue
    launched = {}
    if os.path.isfile(study.record_path(name)):
      with open(study.record_path(name)) as f:
        launched = json.load(f)
    payload["runs"][name] = {"command": "python -m albert_jax.main " + " ".join(study.argv(run)),
                             "wall_s": launched.get("wall_s"), "other_cpu_share": launched.get("other_cpu_share"),
                             "scores": score(study, run, MILESTONES)}
  common.write_json_file(args.results, payload)
  common.write_doc_section(args.doc, f"{MODULE} cpu", markdown(payload))
  print(markdown(payload), flush=True)
  return payload


if __name__ == "__main__":
  main()
