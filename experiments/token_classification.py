"""Your own tagging data (NER, POS) in CoNLL format: `experiments/token_classification.py:data=DIR`.

Args: data (a folder with train.txt, dev.txt[, test.txt]: `word ... tag` per line, blank line between
sentences), labels ("B-PER|I-PER|O": tags in output order; empty = the sorted tags of the train file), size, spm.
"""
from experiments import common


def get_config(arg=None):
  args = common.parse_arg(arg, size="base", data="", spm="", labels="")
  return common.own_data_config(args.size, "token_classification", args.data, args.spm, max_seq_length=128,
                                learning_rate=5e-5, batch=32, labels=args.labels)
