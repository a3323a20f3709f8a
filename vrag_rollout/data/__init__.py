"""Prompts and datasets for the trainer.

- `prompts`: building a prompt batch as EasyR1 does (chat template, images, position ids).
- `dataset`: converting document-QA JSON into the trainer's parquet.
- `fixture_calls`: recording the retriever calls a converted dataset's questions can make, for replay.
"""
