"""The kinds of job (`albert_jax.job_kinds`): chosen once from config.task, each running the modes it implements; a
new kind registers by subclassing one and overriding its job."""
import pytest

from albert_jax import job_kinds, runner, tpu_compile
from albert_jax.errors import InputError
from albert_jax.run import Run
from experiments import glue, pretrain_tiny


def test_the_task_chooses_the_kind():
  assert type(job_kinds.kind_for(pretrain_tiny.get_config("synthetic"))) is job_kinds.Pretraining
  assert type(job_kinds.kind_for(glue.get_config("task=rte,size=tiny"))) is job_kinds.FineTuning


def test_a_mode_the_kind_lacks_is_refused_naming_the_modes_it_has():
  with pytest.raises(InputError) as refused:
    runner.run(pretrain_tiny.get_config("synthetic"), Run("unused"), "predict")
  assert str(refused.value) == ("--mode=predict does not apply to pretraining configs; use one of: train, eval, embed, "
                                "compile, describe.")


def test_a_registered_kind_runs_the_modes_of_its_base_with_its_own_job(monkeypatch):
  """A kind such as ELECTRA's: a pretraining kind whose job is its own; compile (and embed, describe) build it."""
  made = []

  class Replacement(job_kinds.Pretraining):
    label = "replacement"

    def make_job(self, config, run=None):
      made.append(config.task)
      return "its job"

  monkeypatch.setitem(job_kinds.KINDS, "replacement", Replacement)
  config = pretrain_tiny.get_config("synthetic")
  config.task = "replacement"
  kind = job_kinds.kind_for(config)
  assert type(kind) is Replacement
  assert [name for name, mode in runner.MODES.items() if kind.has(mode.method)] == [
      "train", "eval", "embed", "compile", "describe"]
  assert tpu_compile.job_for(config, kind) == "its job" and made == ["replacement"]
  with pytest.raises(InputError, match="^--mode=predict does not apply to replacement configs"):
    runner.run(config, Run("unused"), "predict")
