"""`--mode=embed --input=TEXTS --output=OUT.npy [--pooling=mean|pooled]`: one vector per line of a text file.

The backbone of the workdir's weights (fine-tuning: best, else latest; pretraining: latest), or of
`config.init_checkpoint` when the workdir has none (a converted or pretraining checkpoint used as it is). Each
line is one text, `[CLS] text [SEP]` cut to `data.max_seq_length`; row i of the float32 array [lines, hidden]
is line i (blank lines included, so rows and line numbers agree). `pooled`: the [CLS] pooler output (tanh dense,
what the sentence heads see); `mean`: the mean of the last layer's vectors over the attention mask, special
tokens included (sentence-transformers' mean pooling).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import checkpointing, engine, finetune, pretrain, pretrained, storage
from albert_jax.head_identity import read_best
from albert_jax.errors import InputError
from albert_jax.model import AlbertModel, init_params
from albert_jax.model_config import is_electra, is_pretraining, model_config_from
from albert_jax.tasks import get_task, make_tokenizer
from albert_jax.tasks.base import model_inputs, stack_packed
from albert_jax.tasks.records import text_lines
from albert_jax.tasks.sequence import pack_text

POOLINGS = ("mean", "pooled")


def embed_fn(model: AlbertModel, pooling: str):
  def embed(params, batch):
    sequence, pooled = model.apply({"params": params}, **model_inputs(batch), deterministic=True)
    if pooling == "pooled":
      return {"embedding": pooled.astype(jnp.float32)}
    mask = batch["attention_mask"][..., None].astype(jnp.float32)
    return {"embedding": (sequence.astype(jnp.float32) * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)}
  return embed


def _weights_path(config, workdir: str) -> tuple[str, str]:
  """(where the weights are, the flag that named it): the workdir's, else init_checkpoint's."""
  if read_best(workdir) or storage.path(checkpointing.checkpoint_dir(workdir)).is_dir():
    return workdir, "--workdir"
  if config.init_checkpoint:
    return config.init_checkpoint, "init_checkpoint"
  raise InputError(f"No weights to embed with: {workdir} has no checkpoints and config.init_checkpoint is empty; "
                   "pass --workdir of a training run or --config.init_checkpoint=DIR (an albert_jax.convert output).")


def _job(config, backbone: AlbertModel) -> engine.Job:
  """The config's own job: `engine.setup` takes mesh, batch split and shardings from it as training does. A
  fine-tuning task's job is built around the backbone alone: its head plays no part here, and building it could
  need the class set of a train file that embedding does not read."""
  if is_pretraining(config) or is_electra(config):  # an ELECTRA run embeds with its discriminator
    return pretrain.make_job(config)
  job = finetune.make_job(config, get_task(config), backbone)
  return dataclasses.replace(job, init_params=lambda rng: init_params(backbone, rng))


def embed(config, workdir: str, args) -> None:
  if not args.input or not args.output:
    raise InputError("--mode=embed needs --input=FILE (one text per line) and --output=PATH.npy.")
  if args.pooling not in POOLINGS:
    raise InputError(f"--pooling={args.pooling!r}; choose one of {POOLINGS}.")
  path, name = _weights_path(config, workdir)
  config = pretrained.with_recorded_model(config, path)
  tokenizer = make_tokenizer(config)
  model_config = model_config_from(config)
  tokenizer.check_vocab(model_config.vocab_size)
  max_len = config.data.max_seq_length
  model_config.check_seq_length(max_len)
  # Only the backbone is used, so a fine-tuning run's head (its task, its classes) does not matter here.
  params, which = pretrained.load_init_params(path, name, model=config.model), f"{name} {path}"
  if "albert" not in params:
    raise InputError(f"The weights ({which}) have no backbone 'albert' (found {sorted(params)}).")
  texts = [line for _, line in text_lines(args.input)]  # a CR-only file is refused, not embedded as one text
  if texts[-1] == "":  # the newline that ends the last line starts no text
    texts.pop()
  if not texts:
    raise InputError(f"{args.input} has no lines to embed.")
  features = stack_packed([pack_text(tokenizer, text, None, max_len) for text in texts], (len(texts),))
  backbone = AlbertModel(model_config)
  s = engine.setup(config, _job(config, backbone))
  with s.context():
    outputs = finetune.predict_features(embed_fn(backbone, args.pooling), s.replicate(params["albert"]), features,
                                        s, f"embedding {args.input}", finetune.length_buckets(config))
  if jax.process_index() == 0:
    with storage.open_atomic(args.output, "wb") as f:  # the very name given (np.save adds .npy), folders made
      np.save(f, outputs["embedding"].astype(np.float32))
    print(f"Wrote {args.pooling} embeddings {outputs['embedding'].shape} of {args.input} ({which}) to {args.output}",
          flush=True)
