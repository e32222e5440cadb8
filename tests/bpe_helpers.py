"""Shared by the byte-level BPE tests (test_tokenization_bpe.py, test_finetuning_bpe.py): a
ModernBERT-like tokenizer.json trained in the test on the bundled corpus."""
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from bertjax.data import sources

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]  # ModernBERT's order: 50280...50284


def write_modernbert_like_tokenizer(path) -> str:
  """Writes a byte-level BPE tokenizer.json to `path` as ModernBERT's is made: 800 pieces of
  400 sentences of the bundled corpus, a run of two spaces as an added token, SPECIALS added
  last (so [PAD] is not 0), and the post-processor [CLS] $A [SEP] / [CLS] $A [SEP] $B [SEP].
  Returns the path as a string."""
  corpus = [s for doc in sources.read_text_files(sources.BUNDLED_CORPUS)[:30] for s in doc][:400]
  tok = HFTokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  tok.add_tokens(["  "])  # ModernBERT holds runs of spaces as (non-special) added tokens
  tok.add_special_tokens(SPECIALS)
  cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
  tok.save(str(path))
  return str(path)
