"""What a run is made from, recorded in its folder (`Run.provenance`) and checked by whoever reads the run.

The inputs that define a run, each by the sha256 of its whole file: the tokenizer (SentencePiece model), the prepared
data (its manifest.json, which names every shard and the preparation's settings; the bundled tiny corpus's too) and
a fine-tuning task's data files (train and dev). A copy with the same bytes and a new mtime is the same input. A
resume compares what it reads now with what the run recorded (`resume_with_changes` accepts a change); a reader of
the run's weights (a warm start from it, eval, predict, embed) compares the tokenizer it would use, and eval also
what it scores against, pretraining's the prepared data and fine-tuning's the dev files, whose labels give the
score (`accept_changed_inputs` accepts a change); an export (`convert --to=hf`)
compares the tokenizer it writes. A run recorded before fingerprints were kept is read as it is.
"""
from __future__ import annotations

import json
import os

from albert_jax import storage
from albert_jax.errors import InputError
from albert_jax.run.layout import Run
from data_pipeline import fingerprints, records, tiny

TOKENIZER, PREPARED_DATA = "tokenizer", "prepared data"


def tokenizer_of(config) -> str:
  """The tokenizer a config tokenizes with: data.spm_model, else its prepared data's (the bundled corpus's,
  data.kind=tiny, is always the SentencePiece model kept as its preparation's spiece.model, built or not yet);
  "" for none."""
  data = config.data
  if data.get("spm_model"):
    return data.spm_model
  folder = _prepared_folder(data)
  if folder and data.get("kind") == "tiny":
    return os.path.join(folder, records.SPM_MODEL)
  manifest = _manifest(data)
  if not manifest:
    return ""
  model = json.loads(storage.path(manifest).read_text()).get("tokenizer", {}).get("model", "")
  return os.path.join(folder, model) if model else ""


def _prepared_folder(data) -> str:
  """The folder of the prepared data that `data` (a config.data) reads: data.path, or for the bundled corpus
  (data.kind=tiny, data.path the folder it is built in) its preparation inside; "" for none."""
  if not data.get("path"):
    return ""
  return {"prepared": data.path, "tiny": tiny.prepared_dir(data.path, tiny.tokenizer_kind(data))}.get(data.get("kind"), "")


def _manifest(data) -> str:
  folder = _prepared_folder(data)
  manifest = os.path.join(folder, records.MANIFEST)
  return manifest if folder and (data.get("kind") == "tiny" or storage.path(manifest).is_file()) else ""


def pretraining_inputs(config) -> dict[str, str]:
  """{what: path} of the files a pretraining run reads: its tokenizer and its prepared data's manifest. For
  data.kind=tiny, data.path is the folder the run builds the bundled corpus in."""
  return {TOKENIZER: tokenizer_of(config), PREPARED_DATA: _manifest(config.data)}


def fine_tuning_inputs(config, task, splits: tuple[str, ...] | None = None) -> dict[str, str]:
  """{what: path} of the files a fine-tuning run reads: its tokenizer and the task's `splits` (default: the train
  and dev files; those it has: a prediction-only task, GLUE AX, has no train split)."""
  inputs = {TOKENIZER: tokenizer_of(config)}
  for name in splits if splits is not None else ("train", *task.eval_splits):
    try:
      inputs[f"{name} file"] = task.split_path(name)
    except InputError:
      continue
  return inputs


def fingerprint(inputs: dict[str, str]) -> dict[str, dict[str, str]]:
  """{what: {"path", "sha256"}} of each input that is a file."""
  return {what: {"path": storage.absolute(path), "sha256": fingerprints.sha256(path)}
          for what, path in inputs.items() if path and storage.path(path).is_file()}


def recorded(run: Run) -> dict[str, dict[str, str]]:
  """The fingerprints `run` recorded; {} for a run that kept none."""
  file = storage.path(run.provenance)
  return json.loads(file.read_text()) if file.is_file() else {}


def record(run: Run, made_of: dict[str, dict[str, str]]) -> None:
  """Writes the run's fingerprints (process 0 of the run calls it, with its config.json)."""
  storage.write_atomic(run.provenance, json.dumps(made_of, indent=2))


def changes(before: dict[str, dict[str, str]], now: dict[str, dict[str, str]]) -> list[str]:
  """What differs between two sets of fingerprints, for each input both have."""
  return [f"the {what} ({now[what]['path']}: sha256 {before[what]['sha256'][:12]} then, {now[what]['sha256'][:12]} "
          "now)" for what in before if what in now and before[what]["sha256"] != now[what]["sha256"]]


def check(who: str, before: dict, now: dict, config, flag: str) -> None:
  """Refuses in one line inputs that are not the ones `who` (the run, by the flag that named it) was made from,
  unless config.<flag> accepts them: then it says so."""
  changed = changes(before, now)
  if not changed:
    return
  if not config.get(flag, False):
    raise InputError(f"{who} was made from other inputs: {'; '.join(changed)} changed. Restore them, or pass "
                     f"--config.{flag}=True to go on with these.")
  print(f"{who} was made from other inputs: {'; '.join(changed)} changed; going on with these "
        f"({flag}=True).", flush=True)


def check_resume(run: Run, inputs: dict[str, str], config) -> None:
  """A resume reads what the run was made from: refused otherwise, `resume_with_changes` accepting the change."""
  check(f"Workdir {run.workdir}", recorded(run), fingerprint(inputs), config, "resume_with_changes")


def check_reader(run: Run | None, who: str, config, inputs: dict[str, str] | None = None) -> None:
  """Weights of `run` (None: converted weights), named as `who`, read with the tokenizer `config` uses now (and the
  other `inputs` given): refused when the run recorded other bytes for them, `accept_changed_inputs` accepting the
  change."""
  if run is not None:
    inputs = inputs or {TOKENIZER: tokenizer_of(config)}
    check(who, recorded(run), fingerprint(inputs), config, "accept_changed_inputs")


def check_export(run: Run | None, who: str, tokenizer: str) -> None:
  """An export of weights of `run` (None: converted weights), named as `who`, writes the tokenizer they were trained
  with: refused when the file `tokenizer` holds other bytes than the run recorded (a copy with the same bytes is
  that tokenizer)."""
  changed = changes(recorded(run), fingerprint({TOKENIZER: tokenizer})) if run is not None else []
  if changed:
    raise InputError(f"{who} was trained with another tokenizer: {changed[0]}. Restore it, or pass "
                     "--spm_model= a copy of the one the run recorded, so that the export gives the model's ids.")
