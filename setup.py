"""bertjax: BERT (Devlin et al., 2019) in JAX/Flax, pretraining and fine-tuning.

Versions are pinned to a set seen installing and working together on Python 3.11.
"""
import setuptools

# TensorFlow reads Google's BERT checkpoints (bertjax.convert.tf). The CPU build is enough; it has
# wheels for x86-64 Linux and Windows only, so other machines (macOS arm64, Linux aarch64) take
# the full build of the same version.
TENSORFLOW = [
    'tensorflow-cpu==2.21.0; platform_machine == "x86_64" or platform_machine == "AMD64"',
    'tensorflow==2.21.0; platform_machine != "x86_64" and platform_machine != "AMD64"',
]

setuptools.setup(
    name="bertjax",
    version="0.1.0",
    description="BERT in JAX/Flax: pretraining (MLM + NSP) and fine-tuning on CPU, GPU and TPU.",
    packages=setuptools.find_packages(include=["bertjax", "bertjax.*"]),
    package_data={"bertjax": ["data/corpus/*.txt", "data/corpus/*.md", "data/finetuning/movie_reviews/*.txt",
                              "data/finetuning/movie_reviews/*.md"]},
    python_requires=">=3.10",
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        # jax's float8/int4 types. 0.7.0 takes 0.55 s to import (0.6.0: 5 ms), in every process
        # that imports jax: every command's start, and the suite's 240 processes.
        "ml_dtypes==0.6.0",
        "flax==0.12.8",
        "optax==0.2.8",
        "orbax-checkpoint==0.12.8",
        "ml_collections==1.1.0",
        "sentencepiece==0.2.3",
        "tokenizers==0.23.3",  # WordPiece (vocab.txt)
        "safetensors==0.8.0",  # Hugging Face weights, read without pickle
        "tensorflow-datasets==4.9.10",
        "grain==0.2.18",
        "numpy>=2.0,<3",
        "absl-py==2.5.1",
        "tqdm==4.70.1",
        "tensorboardX==2.6.5",
        "clu==0.0.12",  # metrics (clu.metrics only: its metric_writers import TensorFlow)
        "seqeval==1.2.2",  # entity-level NER F1 (conlleval's rules)
        "matplotlib==3.11.2",  # WORKDIR/curves.png (bertjax.training.curves; imported only to draw)
    ],
    extras_require={
        # pytest-xdist runs the suite in two workers (README command 2: 9 min instead of 11.5 on 2
        # cores). Reference peers for parity tests and benchmarks: torch's CPU build, transformers;
        # scikit-learn and scipy are the references metrics.py is checked against;
        # TensorFlow writes the Google checkpoints that tests/test_convert_tf.py converts; Beam runs
        # tests/test_prepare_beam.py; nbclient runs launch/colab.ipynb in an ipykernel
        # (tests/test_colab.py), whose tables are pandas'; torch-optimi is the StableAdamW
        # ModernBERT trained with (the reference run, bertjax.tools.torch_pretraining);
        # sentence-transformers is the reference of bertjax.embedding (tests/test_embed.py).
        "test": [
            "pytest==9.2.0", "pytest-xdist==3.8.0", "torch==2.13.0", "transformers==5.23.0",
            "scikit-learn==1.7.2", "apache-beam==2.77.0", *TENSORFLOW,
            "nbclient==0.11.0", "nbformat==5.11.1", "ipykernel==7.4.0", "pandas==3.1.1",
            "torch-optimi==0.3.3", "sentence-transformers==6.2.0",
        ],
        # Google's TF checkpoints and TFDS's tf.data path; large (~270 MB wheel), so optional.
        "tf": TENSORFLOW,
        # Pretraining data prepared by a Beam pipeline (bertjax.data.prepare --runner=NAME).
        "beam": ["apache-beam==2.77.0"],
    },
)
