"""What a sentencepiece .model file holds beyond what its processor exposes: the pieces with
their scores, the model type and the normalizer (its precompiled table and switches).

  model = sentencepiece_proto.parse(open("vocab.model", "rb").read())
  model.trainer_spec.model_type  # 1 unigram, 2 BPE
  model.normalizer_spec.precompiled_charsmap

Read with protobuf through a declared part of sentencepiece's `sentencepiece_model.proto` (the
fields below, with sentencepiece's numbers and defaults; the rest of the file is skipped).
sentencepiece's own generated module needs a newer protobuf runtime than apache-beam and
TensorFlow allow, so it is not imported.
"""
from __future__ import annotations

import functools

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

UNIGRAM, BPE = 1, 2  # TrainerSpec.ModelType

# (message, [(field, number, type, default)]); the types are descriptor_pb2.FieldDescriptorProto's.
_STRING, _FLOAT, _INT32, _BOOL, _BYTES, _MESSAGE = 9, 2, 5, 8, 12, 11
_MESSAGES = (
    ("SentencePiece", [("piece", 1, _STRING, None), ("score", 2, _FLOAT, None),
                       ("type", 3, _INT32, "1")]),  # 1 normal, 2 unknown, 3 control, 6 byte
    ("TrainerSpec", [("model_type", 3, _INT32, "1"), ("split_by_whitespace", 22, _BOOL, "true"),
                     ("byte_fallback", 35, _BOOL, "false"), ("unk_id", 40, _INT32, "0")]),
    ("NormalizerSpec", [("precompiled_charsmap", 2, _BYTES, None),
                        ("add_dummy_prefix", 3, _BOOL, "true"),
                        ("remove_extra_whitespaces", 4, _BOOL, "true")]),
)
_MODEL = ("ModelProto", [("pieces", 1, "SentencePiece", "repeated"),
                         ("trainer_spec", 2, "TrainerSpec", None),
                         ("normalizer_spec", 3, "NormalizerSpec", None)])


@functools.cache
def _model_class():
  """The protobuf class of the declared ModelProto."""
  file = descriptor_pb2.FileDescriptorProto(name="bertjax_sentencepiece_model.proto",
                                            package="bertjax_sentencepiece", syntax="proto2")
  optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
  for name, fields in _MESSAGES:
    message = file.message_type.add(name=name)
    for field, number, kind, default in fields:
      added = message.field.add(name=field, number=number, type=kind, label=optional)
      if default is not None:
        added.default_value = default
  name, fields = _MODEL
  message = file.message_type.add(name=name)
  for field, number, kind, label in fields:
    message.field.add(
        name=field, number=number, type=_MESSAGE, type_name=f".bertjax_sentencepiece.{kind}",
        label=(descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if label == "repeated"
               else optional))
  pool = descriptor_pool.DescriptorPool()
  pool.Add(file)
  return message_factory.GetMessageClass(
      pool.FindMessageTypeByName("bertjax_sentencepiece.ModelProto"))


def parse(model_proto: bytes):
  """The declared fields of a sentencepiece model file's bytes (a protobuf message)."""
  model = _model_class()()
  model.ParseFromString(model_proto)
  return model
