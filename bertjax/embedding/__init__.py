"""Sentence embeddings: a model directory (sentence-transformers', Hugging Face's or bertjax's)
turned into one vector a text (`embedder.Embedder`), by sentence-transformers' rules
(`st_files`: its directory layout; `pooling`: its pooling modes); and the contrastive losses
that train such models over a whole batch (`losses`)."""
