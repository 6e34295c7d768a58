"""A GLUE submission folder from finished runs: `python -m albert_jax.glue_submission --runs DIR... --out DIR`.

Each run is a fine-tuning workdir of `experiments/glue.py` (its config.json names the task) holding the test
predictions that training wrote under the GLUE server's names (CoLA.tsv, ..., MNLI-m.tsv, MNLI-mm.tsv, AX.tsv;
an MNLI run writes AX.tsv too when DATA/glue/diagnostic/ is there). Where several runs give the same file
(seeds), the one with the best dev score in best/best.json is taken. Every file is checked as the server reads
it: the header `index<TAB>prediction`, a known label (STS-B: a number) on every row, and the official number of
test rows; then copied to --out, which must hold no other file (an earlier assembly's would be zipped with
them). Zip that folder's files to upload: `cd OUT && zip ../submission.zip *.tsv`.
"""
from __future__ import annotations

import argparse
import json
import math
import os

from albert_jax import storage
from albert_jax.errors import ExistsError, InputError, MissingFileError, one_line_user_errors
from albert_jax.run import Run, check_output
from albert_jax.tasks import TaskSettings
from albert_jax.tasks.input_text import DataFileError
from albert_jax.tasks.glue import SPECS, GlueTask
from albert_jax.tasks.records import tsv_rows
from data_pipeline import writers

# Rows of each official test file (the GLUE server refuses a submission with any other count).
TEST_ROWS = {"CoLA.tsv": 1063, "SST-2.tsv": 1821, "MRPC.tsv": 1725, "STS-B.tsv": 1379, "QQP.tsv": 390965,
             "MNLI-m.tsv": 9796, "MNLI-mm.tsv": 9847, "QNLI.tsv": 5463, "RTE.tsv": 3000, "WNLI.tsv": 146,
             "AX.tsv": 1104}
FILE_TASKS = {file: name for name, spec in SPECS.items() for file in spec.submission.values()}


def check_file(path: str, check_count: bool) -> int:
  """The number of prediction rows, after checking the header, every index (an integer, once) and every label;
  raises DataFileError naming the row."""
  task = GlueTask(TaskSettings(task="glue", task_name=FILE_TASKS[os.path.basename(path)]))
  rows = tsv_rows(path)
  number, header = next(rows, (1, []))
  if header != ["index", "prediction"]:
    raise DataFileError(path, number, f"the header must be 'index<TAB>prediction', got {header}")
  count, seen = 0, {}
  for number, fields in rows:
    if len(fields) != 2:
      raise DataFileError(path, number, f"{len(fields)} tab-separated fields, expected 2 (index, prediction)")
    if not fields[0].isdigit():
      raise DataFileError(path, number, f"index {fields[0]!r} is not the test file's row index (0, 1, ...)")
    if fields[0] in seen:
      raise DataFileError(path, number, f"index {fields[0]} again (first on line {seen[fields[0]]}); each test row is "
                                     "predicted once")
    seen[fields[0]] = number
    task._label(fields[1], path, number)
    count += 1
  expected = TEST_ROWS[os.path.basename(path)]
  if check_count and count != expected:
    raise DataFileError(path, None, f"{count} predictions but the GLUE test set has {expected}; predict the full "
                                 "official test file (or pass --no_check_counts for a trial folder).")
  return count


def dev_score(run: Run) -> float:
  """The run's best dev value (runs without best.json, e.g. AX-only prediction runs, rank last)."""
  path = run.best_record
  if not storage.path(path).exists():
    return -math.inf
  return float(json.loads(storage.path(path).read_text())["value"])


def assemble(runs: list[Run], out: str, allow_partial: bool = False, check_counts: bool = True) -> dict[str, Run]:
  """{file name: the run it was taken from}, after copying each chosen file into `out`, which one assembly writes
  at a time (`writers.WriterLock`) and which must hold no other file."""
  check_output("--out", out)  # a run's own folder (best/, checkpoints/) would be mixed with the submission
  folders = [run.workdir for run in runs]
  if twice := next((folder for i, folder in enumerate(folders)
                    if writers.resolved(folder) in map(writers.resolved, folders[:i])), None):
    raise InputError(f"--runs lists {twice} twice; list each run once.")
  given: dict[str, list[tuple[float, Run]]] = {}  # file name -> (dev score, run) of every run that has it
  for run in runs:
    writers.check_apart("--out", out, "--runs", run.workdir, "the submission")
    if not storage.path(run.config).exists():
      raise MissingFileError(f"{run.config} not found; --runs takes fine-tuning workdirs of experiments/glue.py.")
    task = json.loads(storage.path(run.config).read_text()).get("task")
    if task != "glue":
      raise InputError(f"{run.workdir} is a {task!r} run, not a GLUE one; leave it out of --runs.")
    score = dev_score(run)
    for name in TEST_ROWS:
      if storage.path(run.predictions(name)).exists():
        given.setdefault(name, []).append((score, run))
  chosen = {name: _best(name, candidates) for name, candidates in given.items()}
  missing = [name for name in TEST_ROWS if name not in chosen]
  if missing and not allow_partial:
    raise InputError(f"No run has {', '.join(missing)}; the GLUE server needs all {len(TEST_ROWS)} files. Add the "
                     "runs that wrote them (AX: an MNLI run with DATA/glue/diagnostic/, or experiments/glue.py:task=ax "
                     "with init_checkpoint = the MNLI model), or pass --allow_partial.")
  for name, (_, run) in chosen.items():
    check_file(run.predictions(name), check_counts)
  with writers.WriterLock(os.path.join(out, writers.LOCK_FILE), f"--out={out}", "--out"):
    _check_no_other_files(out, set(chosen))
    for name, (_, run) in chosen.items():
      storage.copy_atomic(run.predictions(name), os.path.join(out, name))
  return {name: run for name, (_, run) in sorted(chosen.items())}


def _best(name: str, candidates: list[tuple[float, Run]]) -> tuple[float, Run]:
  """The run with the best dev score of those giving file `name` (equal scores: the one listed first), said on the
  console with the runs passed over; refused when none of several has a dev score to choose by."""
  best = max(candidates, key=lambda candidate: candidate[0])  # max keeps the first of equals
  if len(candidates) > 1:
    if best[0] == -math.inf:
      given_by = ", ".join(run.workdir for _, run in candidates)
      raise InputError(f"{name} is given by {len(candidates)} runs ({given_by}) and none has best/best.json to "
                       "choose by; leave all but one out of --runs.")
    others = ", ".join(f"{run.workdir} ({'no best/best.json' if score == -math.inf else f'{score:g}'})"
                       for score, run in candidates if (score, run) != best)
    print(f"{name}: taking {best[1].workdir} (best dev value {best[0]:g}) over {others}.", flush=True)
  return best


def _check_no_other_files(out: str, names: set[str]) -> None:
  """Refuses files in `out` that this assembly does not write: an earlier assembly's CoLA.tsv would be zipped and
  submitted with this one's files."""
  others = sorted(p.name for p in storage.path(out).iterdir() if p.name not in names and p.name != writers.LOCK_FILE)
  if others:
    raise ExistsError(f"--out={out} holds {', '.join(others)}, which this submission does not write: a zip of the "
                      "folder would submit them too; delete them or choose an empty --out.")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", nargs="+", required=True, help="fine-tuning workdirs (experiments/glue.py)")
  parser.add_argument("--out", required=True, help="the submission folder to write")
  parser.add_argument("--allow_partial", action="store_true", help="write the files found even if some are missing")
  parser.add_argument("--no_check_counts", action="store_true", help="accept files with other than the official "
                      "number of test rows (trial folders)")
  args = parser.parse_args(argv)
  with one_line_user_errors("glue_submission: error: "):
    sources = assemble([Run(folder) for folder in args.runs], args.out, args.allow_partial, not args.no_check_counts)
  for name, run in sources.items():
    print(f"{name}\t{run.workdir}", flush=True)
  print(f"Wrote {len(sources)} file(s) to {args.out}", flush=True)


if __name__ == "__main__":
  main()
