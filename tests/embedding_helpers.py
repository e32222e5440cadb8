"""Models the embedding tests share: a random transformers BERT with a WordPiece tokenizer.json,
a random ModernBERT with a byte-level BPE one, and a sentence-transformers directory over
either; the texts they embed."""
import json
import os

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, processors
from tokenizers import trainers

from convert_modernbert_helpers import SPECIALS, hf_model

WORDS = [f"w{i}" for i in range(95)]
_rng = np.random.default_rng(0)
TEXTS = [" ".join(_rng.choice(WORDS, size=n)) for n in (3, 1, 7, 12, 5, 40, 2, 9, 30, 4)]
TEXTS[2] = TEXTS[2].upper()  # lower-cased by the tokenizer (do_lower_case)


def hf_bert_dir(directory):
  """A random 2-layer transformers BertModel with a WordPiece tokenizer.json, saved."""
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=37,
                                   max_position_embeddings=64)
  transformers.BertModel(config).eval().save_pretrained(directory)
  vocab = os.path.join(directory, "vocab.txt")
  with open(vocab, "w", encoding="utf-8") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
  tokenizer = transformers.BertTokenizerFast(vocab=vocab)
  assert tokenizer.vocab_size == 100 and "[UNK]" not in tokenizer.tokenize(" ".join(WORDS))
  tokenizer.save_pretrained(directory)
  os.remove(vocab)  # as sentence-transformers 6 saves it: tokenizer.json alone
  return directory


def sentence_transformer_dir(directory, encoder_dir, modes, *, dense=False, normalize=False,
                             include_prompt=True, max_seq_length=16):
  """Saves a sentence-transformers model of `encoder_dir` to `directory`; returns it as
  sentence-transformers loads it back."""
  from sentence_transformers import SentenceTransformer, models  # pylint: disable=import-outside-toplevel
  transformer = models.Transformer(encoder_dir, max_seq_length=max_seq_length,
                                   do_lower_case=True)
  width = transformer.get_embedding_dimension()
  modules = [transformer, models.Pooling(width, pooling_mode=modes,
                                         include_prompt=include_prompt)]
  if dense:
    torch.manual_seed(1)
    modules.append(models.Dense(width * len(modes), 8))
  if normalize:
    modules.append(models.Normalize())
  SentenceTransformer(modules=modules, device="cpu",
                      prompts={"query": "search_query: ", "doc": "w3 w4"}).save(directory)
  return SentenceTransformer(directory, device="cpu")


def modernbert_dir(directory):
  """A random 4-layer transformers ModernBertModel with a byte-level BPE tokenizer.json."""
  hf_model("ModernBertModel").save_pretrained(directory)
  tok = Tokenizer(tok_models.BPE(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TEXTS * 5, trainers.BpeTrainer(vocab_size=100, special_tokens=SPECIALS,
                                                         show_progress=False))
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
  tok.save(os.path.join(directory, "tokenizer.json"))
  specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
              "mask_token": "[MASK]", "unk_token": "[UNK]"}
  with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", **specials}, f)
  return directory
