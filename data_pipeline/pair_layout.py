"""How fine-tuning inputs join one or two texts around the tokenizer's classification and separator tokens.

BERT's (and ALBERT's, ELECTRA's): `[CLS] A [SEP] B [SEP]`, B and its [SEP] in segment 1. RoBERTa's:
`<s> A </s></s> B </s>`, every token in segment 0 (its models have one token type). A tokenizer names its layout
(`pair_layout`: a tokenizer with RoBERTa's special tokens takes RoBERTa's); `LAYOUTS` has them by name, for whatever
else chooses one.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PairLayout:
  name: str
  separators_between: int  # separator tokens between the two texts
  second_segment: int      # the token type of the second text and the separators after the first one's

  def special_tokens(self, pair: bool) -> int:
    """How many of the max_seq_length tokens the classification and separator tokens take."""
    return 2 + self.separators_between if pair else 2

  @property
  def pair_form(self) -> str:
    """A pair's tokens with BERT's names for the special ones, e.g. `[CLS] A [SEP] [SEP] B [SEP]` for RoBERTa's."""
    return " ".join(["[CLS]", "A", *["[SEP]"] * self.separators_between, "B", "[SEP]"])

  def second_start(self, first_length: int) -> int:
    """The position of the second text's first token."""
    return 1 + first_length + self.separators_between

  def join(self, first: list[int], second: list[int] | None, cls_id: int, sep_id: int
           ) -> tuple[list[int], list[int]]:
    """(ids, token types) of the texts' ids joined in this layout."""
    ids = [cls_id, *first, sep_id]
    types = [0] * len(ids)
    if second is not None:
      rest = [sep_id] * (self.separators_between - 1) + [*second, sep_id]
      ids, types = ids + rest, types + [self.second_segment] * len(rest)
    return ids, types

  def post_processor(self, cls: tuple[str, int], sep: tuple[str, int]):
    """The `tokenizers` post-processor (a TemplateProcessing) that adds the special tokens (and token types) as
    `join` does; `tokenizers` is imported here so that reading a layout's counts does not load it."""
    from tokenizers import processors
    first = [f"{cls[0]}:0", "$A:0", f"{sep[0]}:0"]
    second = [f"{sep[0]}:{self.second_segment}"] * (self.separators_between - 1)
    second += [f"$B:{self.second_segment}", f"{sep[0]}:{self.second_segment}"]
    return processors.TemplateProcessing(single=first, pair=first + second, special_tokens=[cls, sep])


BERT = PairLayout("bert", separators_between=1, second_segment=1)
ROBERTA = PairLayout("roberta", separators_between=2, second_segment=0)
LAYOUTS = {layout.name: layout for layout in (BERT, ROBERTA)}
