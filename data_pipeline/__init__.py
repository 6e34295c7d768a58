"""ALBERT pretraining data: tokenization, sources, sharded preparation, example building, masking, loading."""
