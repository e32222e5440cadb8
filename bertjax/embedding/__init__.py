"""Sentence embeddings: a model directory (sentence-transformers', Hugging Face's or bertjax's)
turned into one vector a text (`embedder.Embedder`), by sentence-transformers' rules
(`st_files`: its directory layout; `pooling`: its pooling modes; `st_export`: a bertjax model
written as one); what trains such models over a whole batch (`model`: the encoder with pooling;
the contrastive losses, `losses`; GradCache, `grad_cache`; the task is
`bertjax.tasks.embeddings`); and how they are scored (`evaluation`, on `eval_files`;
`python -m bertjax.embedding.evaluate`)."""
