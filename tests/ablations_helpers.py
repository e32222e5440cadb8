"""Shared by the tests of the pretraining ablations (test_ablations_spans.py,
test_ablations_readme_runs.py, test_ablations_causal.py): a tiny causal BERT config and a jit
that compiles quickly.
"""
import functools

import jax

from bertjax.models.config import bert_config

# As tests/attention_helpers.py: logits O(1), and XLA's quick compile.
CONFIG = bert_config("tiny", vocab_size=101, num_layers=2, max_position_embeddings=64,
                     dropout_rate=0.0, attention_dropout_rate=0.0, initializer_range=0.2,
                     hidden_act="gelu_tanh", causal=True)
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0,
                                                   "xla_llvm_disable_expensive_passes": True})
