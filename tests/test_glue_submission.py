"""`python -m albert_jax.glue_submission`: the GLUE server's file names from finished runs, the best seed per file,
files checked as the server reads them."""
import json
import re

import pytest

from albert_jax import glue_submission
from albert_jax.errors import InputError
from albert_jax.run import Run


def run_dir(path, value=None, files=()):
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps({"task": "glue"}))
  if value is not None:
    (path / "best").mkdir()
    (path / "best" / "best.json").write_text(json.dumps({"value": value}))
  for name, rows in files:
    (path / name).write_text("index\tprediction\n" + "".join(f"{i}\t{p}\n" for i, p in enumerate(rows)))
  return Run(str(path))


def test_best_seed_per_file_and_checks(tmp_path):
  rte_a = run_dir(tmp_path / "rte0", 0.61, [("RTE.tsv", ["entailment"] * 3)])
  rte_b = run_dir(tmp_path / "rte1", 0.70, [("RTE.tsv", ["not_entailment"] * 3)])
  mnli = run_dir(tmp_path / "mnli", 0.80, [(n, ["neutral", "contradiction"]) for n in
                                           ("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv")])
  stsb = run_dir(tmp_path / "stsb", 0.9, [("STS-B.tsv", ["3.250000", "0.5"])])
  out = tmp_path / "out"
  with pytest.raises(ValueError, match="No run has CoLA.tsv, SST-2.tsv, MRPC.tsv, QQP.tsv, QNLI.tsv, WNLI.tsv"):
    glue_submission.assemble([rte_a, rte_b, mnli, stsb], str(out))
  with pytest.raises(InputError, match="3 predictions but the GLUE test set has 3000"):
    glue_submission.assemble([rte_a], str(out), allow_partial=True)
  sources = glue_submission.assemble([rte_a, rte_b, mnli, stsb], str(out), allow_partial=True, check_counts=False)
  assert sources == {"AX.tsv": mnli, "MNLI-m.tsv": mnli, "MNLI-mm.tsv": mnli, "RTE.tsv": rte_b, "STS-B.tsv": stsb}
  assert (out / "RTE.tsv").read_text().splitlines()[1] == "0\tnot_entailment"
  assert sorted(p.name for p in out.iterdir()) == sorted(sources)


def test_a_file_given_by_several_runs_says_which_it_takes_over_which(tmp_path, capsys):
  """One of two runs of a task was dropped without a word (issue #48)."""
  rte_a = run_dir(tmp_path / "rte0", 0.61, [("RTE.tsv", ["entailment"])])
  rte_b = run_dir(tmp_path / "rte1", 0.70, [("RTE.tsv", ["not_entailment"])])
  rte_c = run_dir(tmp_path / "rte2", None, [("RTE.tsv", ["entailment"])])
  assert glue_submission.assemble([rte_a, rte_b, rte_c], str(tmp_path / "out"), True, False) == {"RTE.tsv": rte_b}
  assert capsys.readouterr().out == (f"RTE.tsv: taking {rte_b.workdir} (best dev value 0.7) over {rte_a.workdir} "
                                     f"(0.61), {rte_c.workdir} (no best/best.json).\n")
  ax_a = run_dir(tmp_path / "ax0", None, [("AX.tsv", ["neutral"])])
  ax_b = run_dir(tmp_path / "ax1", None, [("AX.tsv", ["neutral"])])
  given_by = f"{ax_a.workdir}, {ax_b.workdir}"
  with pytest.raises(InputError, match="^" + re.escape(f"AX.tsv is given by 2 runs ({given_by}) and none has "
                                                       "best/best.json to choose by; leave all but one out of --runs.")):
    glue_submission.assemble([ax_a, ax_b], str(tmp_path / "out2"), True, False)
  with pytest.raises(InputError, match="^" + re.escape(f"--runs lists {rte_a.workdir}/ twice; list each run once.")):
    glue_submission.assemble([rte_a, rte_b, Run(rte_a.workdir + "/")], str(tmp_path / "out3"), True, False)


def test_a_wrong_label_or_header_is_refused(tmp_path):
  bad = run_dir(tmp_path / "cola", 0.5, [("CoLA.tsv", ["1", "acceptable"])])
  with pytest.raises(InputError, match=r"CoLA.tsv:3: unknown label 'acceptable'"):
    glue_submission.assemble([bad], str(tmp_path / "out"), allow_partial=True, check_counts=False)
  (tmp_path / "cola" / "CoLA.tsv").write_text("id\tlabel\n0\t1\n")
  with pytest.raises(InputError, match="header must be 'index<TAB>prediction'"):
    glue_submission.assemble([bad], str(tmp_path / "out"), allow_partial=True, check_counts=False)


@pytest.mark.parametrize("name, rows, message", [
    ("SST-2.tsv", "0\t1\n0\t0\n", r"SST-2.tsv:3: index 0 again \(first on line 2\); each test row is predicted once"),
    ("SST-2.tsv", "0\t1\nx1\t0\n", r"SST-2.tsv:3: index 'x1' is not the test file's row index"),
    ("STS-B.tsv", "0\t2.5\n1\tnan\n", r"STS-B.tsv:3: label 'nan' is not a finite number"),
    ("STS-B.tsv", "0\tinf\n", r"STS-B.tsv:2: label 'inf' is not a finite number")])
def test_a_repeated_index_or_a_non_finite_score_is_refused(tmp_path, name, rows, message):
  """The server would take them (1821 rows all indexed 0, or 1379 scores of nan): checked beyond the row count,
  they are refused naming the file and line."""
  run = run_dir(tmp_path / "run", 0.5)
  (tmp_path / "run" / name).write_text("index\tprediction\n" + rows)
  with pytest.raises(InputError, match=message):
    glue_submission.assemble([run], str(tmp_path / "out"), allow_partial=True, check_counts=False)
