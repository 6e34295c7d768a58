"""The step-time bound's arithmetic (`albert_jax/step_bound.py`), by hand; the compiled bound is checked through the
CLI in tests/test_tpu_compile.py."""
from __future__ import annotations

import pytest

from albert_jax import step_bound, topology
from albert_jax.model_config import model_config_for


@pytest.mark.parametrize("size, overrides, scan_unroll, looped", [
    ("large", {}, 1, True),                                 # one scanned group of 24, a layer an iteration
    ("large", {"num_hidden_groups": 2}, 12, False),         # two groups of 12, each unrolled
    ("large", {"num_hidden_groups": 2}, 6, True),
    ("large", {}, 24, False),                               # straight-line code: every layer counted
    ("large", {"scan_layers": False}, 1, False),            # the Python loop: every layer in the program
    ("bert_large", {}, 1, False),                           # one layer per group: no loop
    ("base", {"sharing": "ffn"}, 1, False),                 # the partial-sharing ablation's Python loop
])
def test_layers_in_a_loop_are_counted_once_by_the_compiler(size, overrides, scan_unroll, looped):
  assert step_bound.layers_in_a_loop(model_config_for(size, **overrides), scan_unroll) is looped


def test_collectives_over_the_interconnect_and_the_data_centre_network():
  v3 = topology.parse("v3-256")   # two devices a chip, 340 TB/s / 1024 chips all-reduce, 25 Gbit/s network
  totals = {kind: {"within_slice": 0, "across_slices": 0} for kind in step_bound._ALL_REDUCE_EQUIVALENT}
  totals["all-reduce"] = {"within_slice": 10**9, "across_slices": 10**8}
  totals["all-gather"]["within_slice"] = 2 * 10**9  # half an all-reduce's traffic
  ici, dcn = step_bound.collective_seconds(totals, v3)
  assert ici == pytest.approx(2 * 2e9 / (340e12 / 1024))
  assert dcn == pytest.approx(2 * 1e8 / (25e9 / 8))


def test_the_bound_is_the_slowest_part_and_hours_follow_from_it():
  bound = step_bound.StepBound(compute_seconds=0.4, ici_seconds=0.1, dcn_seconds=0.5, tokens_per_step=4096 * 512,
                               model_flops_per_step=2e15, devices=256, peak_flops_per_device=61.5e12,
                               train_steps=125_000)
  assert bound.step_seconds == 0.5
  assert bound.tokens_per_second == 4096 * 512 / 0.5
  assert bound.mfu == pytest.approx(2e15 / (0.5 * 256 * 61.5e12))
  assert bound.hours == pytest.approx(125_000 * 0.5 / 3600)
  assert "data-centre network-bound" in bound.lines()[0]
