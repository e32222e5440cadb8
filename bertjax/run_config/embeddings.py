"""A contrastive embedding run's schema (`EmbeddingsRun`: configs/embeddings.py): the texts it
trains on (pairs, n-tuples with hard negatives, or plain text for SimCSE), the embedding
(pooling, normalisation) and the loss over the global batch (`bertjax.embedding.losses`)."""
from __future__ import annotations

import dataclasses

from bertjax.run_config.finetuning import FinetuningData, FinetuningRun, FinetuningTrain


@dataclasses.dataclass(frozen=True)
class EmbeddingsData(FinetuningData):
  """The texts of a contrastive run, tokenized as the model's own tokenizer does."""
  train_file: str = ""  # (anchor, positive[, hard negatives ...]) a row: TSV (tab-separated, an
  # optional header anchor/positive/negative...) or JSONL ("anchor", "positive", "negative" or
  # "negatives"); with simcse, plain text, one sentence a line ("" = the bundled corpus)
  simcse: bool = False  # unsupervised SimCSE (Gao et al. 2021): each sentence is its own
  # positive, the two copies differing by dropout alone
  eval_file: str = ""  # held-out pairs (the train_file's format), scored as retrieval: each
  # anchor against every held-out positive ("" = eval_fraction of the training rows)
  eval_fraction: float = 0.05  # training rows held out when no eval_file or sts_file (0 = none)
  sts_file: str = ""  # scored sentence pairs (STS-B's TSV), scored as the Spearman correlation
  # of cosines instead of retrieval
  query_prompt: str = ""  # prepended to every anchor (e.g. "search_query: ")
  document_prompt: str = ""  # prepended to every positive and negative ("search_document: ")
  max_seq_length: int = 0  # tokens a text is cut to, special tokens included (0 = the model's:
  # a sentence-transformers model's max_seq_length, else its positions)
  packing: str = "0"  # contrastive rows are one text each (no packing)


@dataclasses.dataclass(frozen=True)
class Contrastive:
  """The embedding a run trains, and its loss (`bertjax.embedding.losses`)."""
  pooling: str = ""  # comma-separated sentence-transformers pooling modes (mean, cls, max, ...);
  # "" = a sentence-transformers model's own (other models need one)
  normalize: bool = False  # the embeddings made unit length (a sentence-transformers model's own
  # Normalize module keeps it); the cosine losses do not change with it
  loss: str = "mnrl"  # mnrl: in-batch softmax (MultipleNegativesRankingLoss); symmetric_mnrl:
  # also each positive against every anchor; sigmoid: SigLIP's, its scale and bias trained
  scale: float = 20.0  # mnrl: the cosines' multiplier (1 / temperature)
  mask_duplicates: bool = True  # a positive text seen twice in a batch is not the other's
  # negative
  matryoshka_dims: str = ""  # e.g. "768,512,256,128,64": the loss summed over these leading
  # dimensions of the embeddings ("" = the whole embedding only)
  matryoshka_weights: str = ""  # one weight a dimension ("" = 1 each)
  grad_cache_chunk: int = 0  # GradCache: examples embedded at a time, dividing the batch (its
  # gradient exactly the whole batch's); 0 = the whole batch at once


@dataclasses.dataclass(frozen=True)
class EmbeddingsTrain(FinetuningTrain):
  """FinetuningTrain with a contrastive run's batch: every example's negatives are the batch's
  other texts, so larger is better."""
  batch_size: int = 64
  num_train_epochs: float = 1.0


@dataclasses.dataclass(frozen=True)
class EmbeddingsRun(FinetuningRun):
  """A contrastive embedding run (`bertjax.tasks.embeddings`)."""
  task: str = "embeddings"
  data: EmbeddingsData = dataclasses.field(default_factory=EmbeddingsData)
  embedding: Contrastive = dataclasses.field(default_factory=Contrastive)
  train: EmbeddingsTrain = dataclasses.field(default_factory=EmbeddingsTrain)
