"""The input-pipeline benchmark runs end to end at tiny size (no timing assertions)."""
import gc
import json

import pytest

from bench import data_pipeline


@pytest.mark.shared_data
def test_benchmark_smoke(shared_data, tmp_path):
  out = tmp_path / "bench.json"
  results = data_pipeline.main(["--smoke", f"--shared_data={shared_data}", f"--output={out}", "--workers=1"])
  assert json.loads(out.read_text()) == results
  assert results["prepare_corpus"]["peak_rss_mb"] > 0 and results["tokenization_mb_per_s_per_core"] > 0
  assert all(results[f"examples_per_s_per_core_seq{s}"] > 0 for s in ("128_pred20", "512_pred20", "512_predfree"))
  assert {"start", "end", "other_cpu_share_during_run", "noisy"} <= set(results["machine"])
  assert [(r["short_seq_scope"], r["documents_from"]) for r in results["loader_vs_builder_seq512"]] == [
      ("document", "memory"), ("document", "disk"), ("chunk", "memory"), ("chunk", "disk")]
  assert all(r["identical_batches"] for r in results["loader_vs_builder_seq512"])
  assert gc.get_freeze_count() == 0   # the timed blocks' frozen objects are handed back to the collector
