"""Sentence embeddings: a model directory (sentence-transformers', Hugging Face's or bertjax's)
turned into one vector a text (`embedder.Embedder`), by sentence-transformers' rules
(`st_files`: its directory layout; `pooling`: its pooling modes); and what trains such models
over a whole batch: the contrastive losses (`losses`) and GradCache (`grad_cache`)."""
