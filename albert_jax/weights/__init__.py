"""Which weights, of which family, with which head and tokenizer: `resolve` turns whatever names them into one
`Weights` value. `store` reads and writes a pretrained-weights folder, `record` reads what was recorded with
weights (model, tokenizer, family), `loading` loads params and fits them into a model.

This file imports nothing, so the formats below `resolve` can import `store` and `record` without a cycle.
"""
