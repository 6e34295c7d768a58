"""`python -m bench.finetune_step`: the fine-tuning train step of a GLUE classification job (RTE: two classes) against
transformers' BertForSequenceClassification / RobertaForSequenceClassification, both families in one process.

Ours is the step the engine compiles for `experiments/glue.py` (`finetune.make_job`, `engine.setup`: forward with
dropout, backward, the recipe's AdamW with clipping, the state donated), with the family's own head
(`classifier_head`) on the released base shape (BERT: bert-base-uncased's config; RoBERTa: roberta-base's).
The peer is transformers' class in PyTorch (float32, train mode, sdpa attention, torch's AdamW with the same
learning rate, betas, epsilon, clipping and weight decay off biases and LayerNorms, as the Trainer groups them) on
as many threads as XLA uses. Both start from the same weights: ours initialised, written as the family's
transformers class (`formats.hf`) and read back by transformers. The sanity rows are both losses on the first batch
without dropout, with their logits and the encoder's last hidden states on the real tokens (they agree
within 1e-4 when both compute the same model); the timed steps run with dropout. Every family's
ours and peer, and one n×n matmul in JAX and in torch (the rate MFU is measured against), are timed in alternating
blocks in one process (`bench.common.interleave`); the ratio is the peer's median step time over ours.

  python -m bench.finetune_step --model bert,roberta --batch 8 --seq-len 128 --steps 20 --block 5
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile

import jax
import numpy as np

from albert_jax import console, finetune, flops
from albert_jax.formats import hf, hf_bert
from albert_jax.model import AlbertModel, flat_matmuls, scan_unroll
from albert_jax.model_config import model_config_from
from albert_jax.tasks import get_task, model_inputs
from bench import common
from experiments import glue

MODULE = "bench.finetune_step"
TASK = "rte"
# The released base models' transformers configs (the fields that differ from BertConfig's defaults).
RELEASED = {"bert": (hf_bert.BERT_LAYOUT, {}),
            "roberta": (hf_bert.ROBERTA_LAYOUT, {"vocab_size": 50265, "max_position_embeddings": 514,
                                                 "type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": 1})}
SANITY_TOLERANCE = 1e-4


def parse_args(argv=None) -> argparse.Namespace:
  console.install()   # the process set up as albert_jax.main sets it up, as the other benchmarks do
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default="bert,roberta", help=f"comma-separated families, of {sorted(RELEASED)}")
  p.add_argument("--batch", type=int, default=8, help="examples per step (one micro batch)")
  p.add_argument("--seq-len", type=int, default=128)
  p.add_argument("--layers", type=int, default=0, help="num_hidden_layers (0 = the released 12)")
  p.add_argument("--hidden-size", type=int, default=0, help="H (0 = the released 768); heads H/64 (at least 1), "
                 "intermediate 4H")
  p.add_argument("--scan-unroll", type=int, default=None, help="model.scan_unroll (0 = every layer; default: "
                 "the config's, as a fine-tuning run compiles it)")
  p.add_argument("--threads", type=int, default=0, help="torch threads (0 = the cores XLA uses)")
  p.add_argument("--steps", type=int, default=20, help="timed steps per runner")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps per runner after the first")
  p.add_argument("--block", type=int, default=5, help="steps per interleaved block")
  p.add_argument("--matmul-size", type=int, default=2048, help="n of the n×n matmul timed in the same interleaving "
                 "in JAX and torch, the rate MFU is measured against (0: skip it)")
  p.add_argument("--results-dir", default=common.RESULTS_DIR)
  p.add_argument("--name", default="", help="JSON file name (default: finetune_step)")
  args = p.parse_args(argv)
  args.model = args.model.split(",")
  unknown = sorted(set(args.model) - set(RELEASED))
  if unknown:
    p.error(f"--model {','.join(unknown)}: choose from {sorted(RELEASED)}")
  return args


def fine_tuning_config(args: argparse.Namespace, family: str):
  """experiments/glue.py's RTE config with the family's released model, head and the benchmark's batch shape."""
  layout, released = RELEASED[family]
  sizes = {}
  if args.layers:
    sizes["num_hidden_layers"] = args.layers
  if args.hidden_size:
    sizes.update(hidden_size=args.hidden_size, num_attention_heads=max(1, args.hidden_size // 64),
                 intermediate_size=4 * args.hidden_size)
  config = glue.get_config(f"task={TASK},size=bert_base")
  config.model.update(layout.config_from_hf({**released, **sizes}, "--model").to_dict())
  if args.scan_unroll is not None:
    config.model.scan_unroll = args.scan_unroll or config.model.num_hidden_layers
  config.classifier_head = layout.family.classifier_head
  config.allow_random_init = True
  config.data.max_seq_length = args.seq_len
  config.data.length_buckets = "none"
  config.train.global_batch_size = config.train.micro_batch_size = args.batch
  return config


def host_batches(config, count: int = 2) -> list[dict[str, np.ndarray]]:
  """GLUE-like pair batches: random ids past the special ones, rows of half to full length right-padded with the
  family's padding id (never among the tokens: RoBERTa counts positions over them), two segments where the model
  has two token types, random labels."""
  c = model_config_from(config)
  batch, seq = config.train.global_batch_size, config.data.max_seq_length
  pad = c.position_offset - 1 if c.position_offset else 0
  rng = np.random.RandomState(config.seed)
  out = []
  for _ in range(count):
    lengths = rng.randint(seq // 2, seq + 1, (batch, 1))
    mask = (np.arange(seq)[None] < lengths).astype(np.int32)
    ids = np.where(mask > 0, rng.randint(3, c.vocab_size, (batch, seq)), pad).astype(np.int32)
    types = (np.arange(seq)[None] >= lengths // 2) * mask if c.type_vocab_size > 1 else np.zeros_like(mask)
    out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types.astype(np.int32),
                "label": rng.randint(0, 2, batch).astype(np.int32)})
  return out


class ClassifierPeer(common.Peer):
  """transformers' sequence classifier of the family read from `folder` (our weights), stepped as `common.Peer`
  steps: forward and loss, backward, clipping, torch's AdamW (decay off biases and LayerNorms, as the Trainer)."""

  def __init__(self, config, folder: str, architecture: str, batch: dict[str, np.ndarray], name: str,
               threads: int):
    torch = self.torch = common.import_torch()
    import transformers
    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    self.name, self.device, self.autocast, self.compile_s = name, torch.device("cpu"), False, 0.0
    self.model = getattr(transformers, architecture).from_pretrained(
        folder, dtype=torch.float32, attn_implementation="sdpa").train()
    named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
    self.parameters = [p for _, p in named]
    no_decay = lambda n: n.endswith("bias") or "LayerNorm" in n
    t = config.train
    self.optimizer = torch.optim.AdamW(
        [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": t.weight_decay},
         {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}],
        lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps)
    self.micro_batches = [{"input_ids": torch.as_tensor(batch["input_ids"], dtype=torch.long),
                           "attention_mask": torch.as_tensor(batch["attention_mask"], dtype=torch.long),
                           "token_type_ids": torch.as_tensor(batch["token_type_ids"], dtype=torch.long),
                           "labels": torch.as_tensor(batch["label"], dtype=torch.long)}]

  def outputs_without_dropout(self) -> tuple[float, np.ndarray, np.ndarray]:
    """(loss, logits, the encoder's last hidden states) on the first batch, in eval mode."""
    self.model.eval()
    with self.torch.no_grad():
      out = self.model(**self.micro_batches[0], output_hidden_states=True)
    self.model.train()
    return float(out.loss), out.logits.numpy(), out.hidden_states[-1].numpy()


def family_runners(args: argparse.Namespace, family: str) -> tuple[common.Ours, ClassifierPeer, dict, str]:
  """Ours and the peer of one family from the same weights, (ours, the peer, the sanity row, the config
  described)."""
  config = fine_tuning_config(args, family)
  c = model_config_from(config)
  task = get_task(config)
  job = finetune.make_job(task, task.build_model(c))
  job = dataclasses.replace(job, flops_per_token=flops.encoder_train_flops_per_token(c, args.seq_len))
  batches = host_batches(config)
  ours = common.Ours(config, f"ours_{family}", job, batches)
  params = jax.device_get(ours.state.params)
  with ours.setup.context():
    our_loss = float(ours.setup.eval_step(ours.state.params, ours.batches[0])["loss"])
  inputs = model_inputs(batches[0])
  our_logits = np.asarray(jax.jit(task.predictor(task.build_model(c)))(params, batches[0])["logits"])
  our_hidden = np.asarray(jax.jit(AlbertModel(c).apply)({"params": params["albert"]}, **inputs)[0])
  with tempfile.TemporaryDirectory() as folder:
    hf.COLUMNS[family].save(c, params, folder, task.hf_head, {})
    peer = ClassifierPeer(config, folder, task.hf_architecture, batches[0], f"peer_{family}",
                          args.threads or common.cpu_threads())
  peer_loss, peer_logits, peer_hidden = peer.outputs_without_dropout()
  real = batches[0]["attention_mask"] > 0   # the padding rows' states differ (RoBERTa's positions) and are unused
  sanity = {"model": family, "ours_loss": our_loss, "peer_loss": peer_loss, "loss_diff": abs(our_loss - peer_loss),
            "logits_diff": float(np.max(np.abs(our_logits - peer_logits))),
            "hidden_diff": float(np.max(np.abs(our_hidden[real] - peer_hidden[real])))}
  sanity["agree"] = max(sanity["loss_diff"], sanity["logits_diff"], sanity["hidden_diff"]) <= SANITY_TOLERANCE
  peer.examples_per_step = ours.examples_per_step
  peer.tokens_per_step, peer.flops_per_token = ours.tokens_per_step, ours.flops_per_token
  described = (f"{family}: {task.hf_architecture} shape L={c.num_hidden_layers} H={c.hidden_size} "
               f"heads={c.num_attention_heads} I={c.intermediate_size} V={c.vocab_size} seq={args.seq_len} "
               f"batch={args.batch} dropout={c.hidden_dropout_prob}/{config.classifier_dropout_prob} "
               f"unroll={scan_unroll(c)} flat_matmuls={flat_matmuls(c)} "
               f"optimizer={config.train.optimizer} lr={config.train.learning_rate}")
  print(described, flush=True)
  return ours, peer, sanity, described


def main(argv=None) -> dict:
  args = parse_args(argv)
  threads = args.threads or common.cpu_threads()
  runners, sanity, described = [], [], {}
  for family in args.model:
    ours, peer, family_sanity, described[family] = family_runners(args, family)
    runners += [ours, peer]
    sanity.append(family_sanity)
  if args.matmul_size:
    runners += [common.Matmul(args.matmul_size, "jax"), common.Matmul(args.matmul_size, "torch")]
  rows, peak, source = common.measure(runners, args)
  by_name = {row["name"]: row for row in rows}
  ratios = {family: by_name[f"peer_{family}"]["median_s"] / by_name[f"ours_{family}"]["median_s"]
            for family in args.model}
  common.print_table(common.table_rows(rows), common.STEP_COLUMNS,
                     f"fine-tuning step ({TASK}), {args.steps} timed steps per runner, interleaved in blocks of "
                     f"{args.block}; {threads} threads each; MFU vs {source}")
  for family, ratio in ratios.items():
    print(f"{family}: ours {ratio:.2f}x the peer's examples/s", flush=True)
  for row in rows:
    if row.get("fraction_of_matmul") is not None:
      print(f"{row['name']}: {row['fraction_of_matmul']:.1%} of the measured jnp.dot rate", flush=True)
  common.print_table(sanity, (("sanity, no dropout", "model", ""), ("ours' loss", "ours_loss", ".6f"),
                              ("peer's loss", "peer_loss", ".6f"), ("loss |diff|", "loss_diff", ".1e"),
                              ("logits max |diff|", "logits_diff", ".1e"),
                              ("hidden states max |diff|", "hidden_diff", ".1e"), ("agree", "agree", "")))
  payload = {"task": TASK, "batch": args.batch, "seq_len": args.seq_len, "threads": threads, "models": described,
             "peak_flops": peak, "peak_source": source, "rows": rows, "ratios": ratios, "sanity": sanity,
             "sanity_tolerance": SANITY_TOLERANCE,
             "notes": ["ratio: the peer's median step time over ours (ours' examples/s over the peer's)",
                       "FLOPs: the encoder's (flops.encoder_train_flops_per_token) for both; the heads are not "
                       "credited", "the peer is eager PyTorch (no torch.compile) in float32"]}
  common.write_json(args, "finetune_step", MODULE, payload)
  return payload


if __name__ == "__main__":
  main()
