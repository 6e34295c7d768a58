"""Dispatch of a mode and task to the module that runs it."""
from __future__ import annotations

import json


def run(config, workdir: str, mode: str, input_path: str | None = None, output_path: str | None = None) -> None:
  if config.task == "pretrain":
    from albert_jax import train
    if mode == "train":
      train.run(config, workdir)
    elif mode == "eval":
      print(json.dumps(train.run_eval(config, workdir)), flush=True)
    else:
      raise ValueError(f"--mode={mode} does not apply to pretraining; use train, eval or describe.")
    return
  from albert_jax import finetune
  finetune.run(config, workdir, mode, input_path, output_path)
