"""`resolve`: whatever names the weights a run reads (a run's folder, its best/step_N, a `convert` output, a
Hugging Face folder or Hub name, a TF1 checkpoint converted by `convert --from=tf1`) turned, once, into one
`Weights` value: the config the run takes from them, their family, the head they hold, their tokenizer and where
they came from. The params are loaded when first asked for: a caller that needs only the rest loads nothing.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Collection

import ml_collections

from albert_jax import families, storage
from albert_jax.formats import hf
from albert_jax.run.best import weights_identity
from albert_jax.weights import loading, record


@dataclasses.dataclass(frozen=True)
class Weights:
  """Weights named by the flag `flag` (init_checkpoint, --workdir), read from `path` (a Hugging Face name's
  conversion, else the value given). `config`: the run's config with what the weights fix (config.model among
  it) taken from their record (`resolve`). `head`: the identity of the head they were fine-tuned with
  (`run.best.weights_identity`), None for a backbone. `tokenizer`: (model file, do_lower_case or None) they were
  trained with, None where none is recorded."""
  path: str
  flag: str
  config: ml_collections.ConfigDict
  family: families.Family
  head: dict | None
  tokenizer: tuple[str, bool | None] | None

  @property
  def origin(self) -> str:
    """How messages name them: 'init_checkpoint /path'."""
    return f"{self.flag} {self.path}"

  @functools.cached_property
  def params(self) -> Any:
    """The params as host arrays (`loading.load_init_params`), loaded on first use, checked against config.model."""
    return loading.load_init_params(self.path, self.flag, model=self.config.model)


def resolve(source: str, config: ml_collections.ConfigDict, overrides: Collection[str] | None = None,
            flag: str = "init_checkpoint", revision: str = "") -> Weights:
  """The weights that `source` names, for a run of `config`. `overrides`: the `a.b` names of the command line's
  `--config.a.b` values (the entry computes them), which stay as given; the model fields and the tokenizer the
  weights fix are taken from their record for the rest, said in one line (`record.take_recorded`). None: a config
  built in Python, used as it is but for its classifier head "auto" (`record.with_classifier_head`). A source
  that is neither ours nor a Hugging Face model is refused in one line, as is a damaged record."""
  path = hf.converted(source, revision, flag) or source
  if not storage.path(path).exists():
    raise loading.not_weights(path, flag)
  family = families.get(record.process_0s(record.backbone_family(path)))
  record.recorded_model(path)  # a damaged model record is refused before anything else reads it
  config = record.with_classifier_head(config, path)
  if overrides is not None:
    config, said = record.take_recorded(config, path, overrides)
    if said:
      record.say(said)
  return Weights(path, flag, config, family, weights_identity(path), record.recorded_tokenizer(path))
