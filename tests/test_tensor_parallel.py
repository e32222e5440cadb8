"""Tensor parallelism with BERT's own vocabulary (bertjax.training.parallel): 30522 rows are padded to
30592 = 239 * 128, which splits over tensor = 2, 4 and 8 devices, and a train step runs over
tensor=4; without padding the mesh is refused with a UserError that names
pad_vocab_to_multiple. One subprocess with 8 CPU devices.

(The step's values do not depend on the shardings, which jit only distributes; a comparison
with one device would test XLA's partitioner, at twice the compile time.)"""
import json
import os
import sys
import textwrap

from conftest import cpu_env
import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints one line 'RESULT {json}'. The model is tiny but for its vocabulary (30592 x 32).
_SCRIPT = textwrap.dedent(f"""
    import dataclasses, json, sys
    sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
    import jax, numpy as np
    assert jax.device_count() == 8, jax.devices()
    from bertjax.training import parallel
    from bertjax.training import task as task_lib
    from bertjax.errors import UserError
    from bertjax.models import heads
    from bertjax.models.config import BertConfig
    import test_train as t

    def task(pad):
      config = BertConfig(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=4,
                          intermediate_size=64, max_position_embeddings=32,
                          dropout_rate=0.0, attention_dropout_rate=0.0,
                          pad_vocab_to_multiple=pad)
      base = t._task(t._config())
      return task_lib.Task(model=heads.BertForPreTraining(config), terms=base.terms,
                           batches=base.batches, schedule=base.schedule, score=base.score)

    def tensor_config(tensor):
      config = t._config()
      return dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, tensor=tensor))

    result = {{}}
    for tensor in (2, 4, 8):
      config = tensor_config(tensor)
      setup = t._build(config, task(128), jax.devices()[:tensor])
      embedding = setup.abstract_state["params"]["bert"]["embeddings"]["word_embeddings"][
          "embedding"]
      result[f"shard_{{tensor}}"] = [embedding.shape,
                                   embedding.sharding.shard_shape(embedding.shape),
                                   list(embedding.sharding.spec)]
    # One train step over data=1 x tensor=4.
    config = tensor_config(4)
    padded = task(128)
    setup = t._build(config, padded, jax.devices()[:4])
    batch = parallel.global_batch(t._first_batch(padded), setup.mesh)
    state, metrics = setup.train_step(setup.init_state(), batch, setup.learning_rate(0))
    embedding = state["params"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
    result["step"] = [int(state["step"]), float(metrics.compute()["loss"]),
                      len(embedding.sharding.device_set),
                      [shard.data.shape for shard in embedding.addressable_shards]]
    result["padding_rows_zero"] = not np.asarray(embedding)[30522:].any()
    try:
      t._build(config, task(1), jax.devices()[:4])
      result["unpadded"] = None
    except UserError as e:
      result["unpadded"] = str(e)
    print("RESULT " + json.dumps(result))
    """)


def test_bert_vocabulary_splits_over_tensor_parallel_devices():
  env = cpu_env(8)
  out = warm_python.run([sys.executable, "-c", _SCRIPT], env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.split("RESULT ", 1)[1])
  for tensor in (2, 4, 8):  # 30592 rows, each device holding its 1/tensor of them
    assert result[f"shard_{tensor}"] == [[30592, 32], [30592 // tensor, 32],
                                         ["tensor", "fsdp"]]  # rows over tensor (fsdp=1)
  step, loss, devices, shards = result["step"]
  assert step == 1 and 9 < loss < 13  # ln(30522) + ln(2) = 11.0 at the start
  assert devices == 4 and shards == [[7648, 32]] * 4
  assert result["padding_rows_zero"]  # never looked up or predicted: no gradient reaches them
  message = result["unpadded"]
  assert message is not None and "pad_vocab_to_multiple" in message
  assert ("bert/embeddings/word_embeddings/embedding (30522, 32): its 'vocab' dimension of "
          "30522 does not split over mesh axis 'tensor'=4") in message
  assert "masked_lm/output_bias (30522,)" in message
