"""bench/paper_small.py, the paper's claims at a small scale: the study at toy scale end to end (its JSON, the
markdown section, a second invocation that runs only what is not recorded), the tables with nothing run yet, and
the command lines of the CPU study."""
import json
import os
import subprocess
import sys

import pytest

from albert_jax import cli
from albert_jax.run.config import SHAPE_FIELDS
from bench import paper_small
from tests.helpers import REPO

TOY = paper_small.SCALES["toy"]
TABLES = ["transfer", "sentence_task", "sharing", "embedding"]


def layer_params(h: int, i: int) -> int:
  """One transformer layer: attention (4 dense H×H), its LayerNorm, the FFN (H×I, I×H) and its LayerNorm."""
  return 4 * (h * h + h) + 2 * h + h * i + i + i * h + h + 2 * h


def run_study(root, shared_data, tables):
  """The toy study, for what `tables` need, as a user runs it: its output and its JSON."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_backend_optimization_level=0")
  command = [sys.executable, "-m", "bench.paper_small", "--scale=toy", f"--root={root / 'study'}",
             f"--results={root / 'toy.json'}", f"--doc={root / 'doc.md'}", f"--shared_data={shared_data}",
             f"--tables={tables}"]
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result.stdout, json.loads((root / "toy.json").read_text())


def launched(out):
  """The runs the driver started, from its lines `[HH:MM:SS] NAME: python -m albert_jax.main ...`."""
  return [line.split("] ", 1)[1].split(": ", 1)[0] for line in out.splitlines()
          if ": python -m albert_jax.main " in line]


def statuses(payload):
  return {t: {row: {m: c["status"] for m, c in cells.items()} for row, cells in table["rows"].items()}
          for t, table in payload["tables"].items()}


@pytest.mark.slow
def test_the_toy_study_reports_what_is_done_and_resumes_without_running_it_again(tmp_path, shared_data):
  (tmp_path / "doc.md").write_text("Prose kept.\n<!-- bench.paper_small toy: begin -->\nold\n"
                                   "<!-- bench.paper_small toy: end -->\nMore prose.\n")
  out, payload = run_study(tmp_path, shared_data, "sentence_task")
  names = [run.name for run in paper_small.plan(TOY)]
  assert names == ["e16_all_sop", "e16_all_sop/mrpc/seed0", "random/mrpc/seed0", "e16_all_nsp", "e16_all_none",
                   "e8_all_sop", "e32_all_sop", "e16_all_sop_l3", "e16_none_sop_l3"]
  assert list(payload["runs"]) == names and payload["corpus"] == "bundled"
  assert (payload["runs_done"], payload["runs_total"]) == (3, 9)
  assert launched(out) == ["e16_all_sop", "e16_all_nsp", "e16_all_none"]
  for name in ("e16_all_sop", "e16_all_nsp", "e16_all_none"):
    record = payload["runs"][name]
    task = record["run"]["sentence_task"]
    assert record["name"] == name and record["kind"] == "pretraining" and record["from_step"] == 0
    assert list(record["held_out"]) == list(dict.fromkeys([task, "sop", "nsp"]))
    # The held-out scores are --mode=eval's: the batches of the evaluation the run logged at its last step.
    assert record["curve"][-1]["step"] == TOY.steps
    assert record["held_out"][task] == pytest.approx(record["curve"][-1])
  assert "sop_accuracy" not in payload["runs"]["e16_all_none"]["held_out"]["none"]
  assert statuses(payload) == {
      "transfer": {"pretrained": {"mrpc": "pending"}, "random": {"mrpc": "pending"}},
      "sentence_task": {t: {"mlm": "done", "sop": "done", "nsp": "done"} for t in ("sop", "nsp", "none")},
      "sharing": {"all": {"params": "done", "mlm": "pending"}, "none": {"params": "done", "mlm": "pending"}},
      "embedding": {"e128": {"params": "done", "mlm": "done"}, "e64": {"params": "done", "mlm": "pending"},
                    "eH": {"params": "done", "mlm": "pending"}}}
  tables = payload["tables"]
  # Chance: what always answering the commoner label scores on the held-out examples, as --mode=eval counts it.
  for task in ("sop", "nsp"):
    chance = payload["runs"]["e16_all_none"]["held_out"][task][f"{task}_majority_accuracy"]
    assert 50 <= 100 * chance == tables["sentence_task"]["rows"]["nsp"][task]["chance"] <= 100
  assert "Chance on these held-out examples" in (tmp_path / "doc.md").read_text()
  assert [(c["row"], c["measure"], c["status"]) for c in tables["sentence_task"]["comparisons"]] == [
      (r, m, "done") for r in ("nsp", "none") for m in ("mlm", "sop", "nsp")]
  # Parameters, by hand: not sharing adds L-1 layers (Table 4's depth, 3); E=8 instead of 16 drops 8 columns of the
  # word, position and token-type tables, 8 LayerNorm scales and biases, and 8 rows of the E->H projection.
  h, v, p = TOY.hidden_size, TOY.vocab_size, TOY.seq_len
  sharing, embedding = tables["sharing"], tables["embedding"]["rows"]
  assert sharing["rows"]["none"]["params"]["value"] - sharing["rows"]["all"]["params"]["value"] == (
      (TOY.sharing_layers - 1) * layer_params(h, 4 * h))
  assert embedding["e128"]["params"]["value"] - embedding["e64"]["params"]["value"] == (v + p + 2 + 2 + h) * 8
  assert sharing["comparisons"][0] | {"difference": None} == {
      "row": "none", "against": "all", "measure": "params", "paper_measure": "params", "paper_sign": 1, "our_sign": 1,
      "difference": None, "same_direction": True, "inside_noise": False, "noise": "exact", "status": "done"}
  doc = (tmp_path / "doc.md").read_text()
  assert doc.startswith("Prose kept.\n<!-- bench.paper_small toy: begin -->\nScale `toy`, corpus: bundled; 3 of 9")
  assert doc.endswith("<!-- bench.paper_small toy: end -->\nMore prose.\n") and "\nold\n" not in doc

  # The second invocation runs only what is not recorded: the baseline, done, is fine-tuned, not trained again.
  results = tmp_path / "study" / "results"
  done = {path.name: path.stat().st_mtime_ns for path in results.iterdir()}
  out, payload = run_study(tmp_path, shared_data, "transfer,sentence_task")
  assert launched(out) == ["e16_all_sop/mrpc/seed0", "random/mrpc/seed0"]
  assert {name: (results / name).stat().st_mtime_ns for name in done} == done
  assert payload["runs_done"] == 5 and statuses(payload)["transfer"] == {
      "pretrained": {"mrpc": "done"}, "random": {"mrpc": "done"}}
  for name in ("e16_all_sop/mrpc/seed0", "random/mrpc/seed0"):
    best = payload["runs"][name]["best"]
    assert best["metric"] == "accuracy" and 0 <= best["value"] <= 1
  comparison = payload["tables"]["transfer"]["comparisons"][0]
  assert (comparison["row"], comparison["paper_sign"], comparison["paper_measure"], comparison["noise"]) == (
      "random", -1, "premise", "seed ranges")


def test_with_nothing_run_every_table_is_pending(tmp_path, shared_data):
  # The file also holds bench.paper_small_recipes's entry, which is kept; an entry of this study is rewritten.
  (tmp_path / "cpu.json").write_text(json.dumps({"runs": "stale", "recipes": {"tables": "kept"}}))
  payload = paper_small.main(["--scale=cpu", f"--root={tmp_path / 'study'}", f"--results={tmp_path / 'cpu.json'}",
                              f"--doc={tmp_path / 'doc.md'}", f"--shared_data={shared_data}", "--report_only"])
  assert json.loads((tmp_path / "cpu.json").read_text()) == {**json.loads(json.dumps(payload)),
                                                             "recipes": {"tables": "kept"}}
  assert payload["runs_done"] == 0 and payload["runs_total"] == 7 + 2 * 4 * 3 + 6 * 2 * 3
  assert all(record == {"status": "pending"} for record in payload["runs"].values())
  cells = [(m, c) for t in payload["tables"].values() for row in t["rows"].values() for m, c in row.items()]
  assert len(cells) == 2 * 4 + 3 * 5 + 2 * 4 + 3 * 4
  assert all(c == {"status": "pending"} for m, c in cells if m != "params")
  # Parameter counts need no run: not sharing adds 11 layers of H=192, FFN 768 (Table 4 at L=12), which makes the
  # not-shared model 4.2x the all-shared one.
  sharing = payload["tables"]["sharing"]["rows"]
  assert sharing["none"]["params"]["value"] - sharing["all"]["params"]["value"] == 11 * layer_params(192, 768)
  assert sharing["none"]["params"]["value"] > 4 * sharing["all"]["params"]["value"]
  assert all(c["status"] == ("done" if c["measure"] == "params" else "pending")
             for t in payload["tables"].values() for c in t["comparisons"])
  assert not os.path.exists(tmp_path / "study")   # nothing run, nothing written there
  doc = (tmp_path / "doc.md").read_text()
  assert "0 of 67 runs done" in doc and "| SOP | pending | pending | pending | pending | pending |" in doc
  assert [t["met"] for t in payload["acceptance"]] == [None] * 7 + [True]
  assert "| not-shared has ≥ 3× the backbone params of all-shared | 6.43M vs 1.54M | yes |" in doc


def test_the_targets_read_the_tables_and_say_which_are_met():
  """Each target at its boundary, and one with a value pending."""
  done = lambda value: {"status": "done", "value": value}
  tables = {"transfer": {"rows": {"pretrained": {"sst-2": done(60.0), "mrpc": done(70.0)},
                                  "random": {"sst-2": done(60.0), "mrpc": {"status": "pending"}}}},
            "sentence_task": {"rows": {"sop": {"mlm": done(10.5), "sop": done(75.0)},
                                       "nsp": {"sop": done(65.0) | {"chance": 60.0}}}},
            "sharing": {"rows": {"all": {"mlm": done(15.0), "params": done(2e6)},
                                 "none": {"mlm": done(15.0), "params": done(6e6)}}}}
  targets = paper_small.acceptance(tables)
  assert [t["met"] for t in targets] == [False, None, False, True, True, True, True, True]
  assert targets[4] == {"claim": "SOP-trained above NSP-trained on held-out SOP by ≥ 10", "values": [75.0, 65.0],
                        "met": True}
  # Chance is the held-out examples' commoner label share, not 50: 65 is within 5 of 60.
  assert targets[5] == {"claim": "NSP-trained within 5 of chance (the commoner label's share) on held-out SOP",
                        "values": [65.0, 60.0], "met": True}
  tables["sentence_task"]["rows"]["nsp"]["sop"]["chance"] = 59.9
  assert paper_small.acceptance(tables)[5]["met"] is False


def test_every_fine_tuning_run_loads_the_model_its_pretraining_run_trains(tmp_path):
  """The command lines of the CPU study, parsed as albert_jax.main parses them: each pretraining run is its table
  row, and each fine-tuning run's model has the shape of the run it starts from."""
  scale = paper_small.SCALES["cpu"]
  study = paper_small.Study(scale, str(tmp_path), "/glue", "shared")
  parse = lambda run: cli.experiment_config(["albert_jax.main", *study.argv(run)])
  models = {}
  for run in paper_small.pretraining_runs(scale):
    config = parse(run)
    assert (config.model.embedding_size, config.model.sharing, config.data.sentence_task) == (
        run.embedding_size, run.sharing, run.sentence_task)
    assert (config.model.hidden_size, config.train.num_train_steps, config.data.max_seq_length) == (
        scale.hidden_size, scale.steps, scale.seq_len)
    assert config.model.num_hidden_layers == config.model.scan_unroll == (12 if "_l12" in run.name else 4)
    assert config.train.learning_rate == (0.005 if "_l12" in run.name else 0.01)   # Table 4's own
    models[run.name] = config.model
  assert len(models) == 7 and paper_small.baseline(scale).name == "e128_all_sop"
  for run in paper_small.plan(scale):
    if isinstance(run, paper_small.Pretraining):
      continue
    config = parse(run)
    init = paper_small.baseline(scale).name if run.init == paper_small.RANDOM else run.init
    assert {f: config.model[f] for f in SHAPE_FIELDS} == {f: models[init][f] for f in SHAPE_FIELDS}
    assert (config.task_name, config.seed, config.train.num_train_steps) == (run.task, run.seed, scale.finetune_steps)
    assert config.init_checkpoint == ("" if run.init == paper_small.RANDOM else study.workdir(run.init))
    assert config.allow_random_init == (run.init == paper_small.RANDOM)


def test_a_root_of_other_settings_is_refused_in_one_line(tmp_path, shared_data):
  root = tmp_path / "study"
  root.mkdir()
  (root / "settings.json").write_text(json.dumps({"scale": {"hidden_size": 128}, "corpus": "shared"}))
  with pytest.raises(SystemExit) as stopped:
    paper_small.main(["--scale=cpu", f"--root={root}", f"--results={tmp_path / 'cpu.json'}",
                      f"--doc={tmp_path / 'doc.md'}", f"--shared_data={shared_data}", "--report_only"])
  assert str(stopped.value) == (f"error: --root={root} holds a study of other settings ({root / 'settings.json'}); "
                                "pass another --root, or remove that folder to start afresh.")
  assert not (tmp_path / "cpu.json").exists()
