"""RoBERTa's pretraining recipe (Liu et al. 2019) on this project's encoder: BERT's shape (no sharing, E = H), MLM
alone on FULL-SENTENCES inputs (`data.packing=full_sentences`), dynamic masking of 15% of the tokens, single words.

`experiments/pretrain_roberta.py:size=tiny|base|large[,tokenizer=unigram|bpe]`. base and large: BERT-base /
BERT-large on prepared data with the paper's Table 9 (seq 512, batch 8k, AdamW β1 0.9, β2 0.98, ε 1e-6, weight
decay 0.01, no gradient clipping, peak lr 6e-4 / 4e-4, warmup 24k / 30k, linear decay to 0 at 500k steps).
`adamw` keeps the original ALBERT's moments without bias correction: within 1% of the corrected update from step
200, when warmup's rate is still 5e-6 (base).
tiny: `pretrain_tiny.py`'s CPU run (bundled corpus, its 4,000-piece tokenizer, LAMB schedule, 500 steps at seq 64)
with the model BERT-shaped and the inputs RoBERTa's, so the two runs compare. `tokenizer=bpe` tokenizes the bundled
corpus with RoBERTa's kind of tokenizer instead, a 4,000-token byte-level BPE that `data_pipeline.train_spm` trains
on it (`data.tiny_tokenizer`); base and large take the tokenizer their prepared data was made with.
The model is RoBERTa's (`families.roberta`: its runs export as RobertaForMaskedLM): exact GELU, LayerNorm eps 1e-5,
positions counted past the tokenizer's padding id (`model.position_offset` = its pad id + 1, as transformers'
RobertaEmbeddings count them): 2 for base and large, RoBERTa's byte-level BPE (`<pad>` 1), whose 512 tokens then
need a 514-row table, and for tiny with `tokenizer=bpe`; 1 for tiny's SentencePiece, whose `<pad>` is 0. With a SentencePiece tokenizer at base or large,
pass --config.model.position_offset=1.
"""
from albert_jax.errors import InputError
from experiments import common, pretrain_tiny

# size: (model size, peak learning rate, warmup steps), Table 9 of the paper
RECIPES = {"base": ("bert_base", 6e-4, 24_000), "large": ("bert_large", 4e-4, 30_000)}
SIZES = ("tiny", *RECIPES)
TOKENIZERS = ("unigram", "bpe")  # the bundled corpus's: SentencePiece's (pretrain_tiny.py's), RoBERTa's kind
ROBERTA_PAD_ID, SENTENCEPIECE_PAD_ID = 1, 0  # the padding ids of RoBERTa's byte-level BPE and of SentencePiece


def get_config(arg=None):
  args = common.parse_arg(arg, size="tiny", tokenizer="unigram")
  if args.size not in SIZES:
    raise InputError(f"Config argument size={args.size!r}; choose one of {list(SIZES)}.")
  if args.tokenizer not in TOKENIZERS:
    raise InputError(f"Config argument tokenizer={args.tokenizer!r}; choose one of {list(TOKENIZERS)}.")
  if args.tokenizer != "unigram" and args.size != "tiny":
    raise InputError(f"Config argument tokenizer={args.tokenizer} chooses the bundled corpus's tokenizer (size=tiny); "
                     f"size={args.size} trains on data prepared with yours (train_spm --model_type={args.tokenizer}).")
  if args.size == "tiny":
    c = pretrain_tiny.get_config()
    c.model.embedding_size = c.model.hidden_size
    c.model.sharing = "none"
    c.data.tiny_tokenizer = args.tokenizer
  else:
    model_size, learning_rate, warmup_steps = RECIPES[args.size]
    c = common.pretraining_config(model_size)
    c.train.global_batch_size = 8192
    c.train.num_train_steps = 500_000
    c.train.optimizer = "adamw"
    c.train.learning_rate = learning_rate
    c.train.warmup_steps = warmup_steps
    c.train.b1, c.train.b2, c.train.eps, c.train.weight_decay = 0.9, 0.98, 1e-6, 0.01
    c.train.clip_grad_norm = 0.0
  c.model_family = "roberta"
  c.model.hidden_act = "gelu"
  c.model.layer_norm_eps = 1e-5
  byte_level = args.size in RECIPES or args.tokenizer == "bpe"
  c.model.position_offset = (ROBERTA_PAD_ID if byte_level else SENTENCEPIECE_PAD_ID) + 1
  c.model.max_position_embeddings = max(c.model.max_position_embeddings,
                                        c.data.max_seq_length + c.model.position_offset)
  c.data.packing = "full_sentences"
  c.data.sentence_task = "none"
  c.data.masking = "dynamic"
  c.data.max_predictions_per_seq = 0  # no cap: 15% of each sequence's tokens
  c.data.ngram = 1
  c.data.short_seq_prob = 0.0         # packed sequences are filled to the length
  return c
