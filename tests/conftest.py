"""Test setup: 8 virtual CPU devices (before jax starts), the shared real-data folder, and the fixtures that
several test modules use (plain helpers are in tests/helpers.py)."""
import json
import os
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # with libtpu installed (the tpu extra), jax would probe for a TPU

import pytest  # noqa: E402

SHARED_DATA = Path(os.environ.get("ALBERT_JAX_SHARED_DATA",
                                  Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(scope="session", autouse=True)
def process_set_up_as_the_commands_do():
  """What every command line sets up in its process (`albert_jax.console.install`), for the code the tests run
  in-process: grain's worker processes read absl flags, which raise unless marked parsed. Done once per test
  process, so that no test depends on an earlier one having run a command in-process."""
  from albert_jax import console
  console.install()


@pytest.fixture(scope="session")
def shared_data() -> Path:
  """../shared/data; absent on a user's machine is a skip, absent in CI (CI set) is a failure."""
  if not SHARED_DATA.is_dir():
    if os.environ.get("CI"):
      pytest.fail(f"CI must have the shared data at {SHARED_DATA}")
    pytest.skip(f"shared data not found at {SHARED_DATA} (set ALBERT_JAX_SHARED_DATA)")
  return SHARED_DATA


@pytest.fixture(scope="module")
def tokenizer(shared_data):
  """ALBERT's tokenizer (the shared spiece.model)."""
  from data_pipeline.tokenization import Tokenizer
  return Tokenizer(str(shared_data / "albert_spm" / "spiece.model"))


@pytest.fixture(scope="session")
def tiny_prepared(tmp_path_factory):
  """The bundled tiny corpus prepared (data_pipeline.tiny), built once per test process; tests only read it."""
  from data_pipeline import tiny
  return tiny.ensure_tiny_dataset(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def squad_json(shared_data):
  """SQuAD v1.1 dev, as read from its JSON file."""
  with open(shared_data / "squad" / "dev-v1.1.json") as f:
    return json.load(f)


@pytest.fixture
def launches():
  """The test's launches (tests.processes.Launch); one still running when the test ends is killed."""
  started = []
  yield started
  for launch in started:
    if launch.proc.poll() is None:
      launch.kill()
