"""Experiment files: each exports `get_config(arg)` returning an ml_collections.ConfigDict."""
