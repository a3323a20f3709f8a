"""Prompts and datasets for the trainer.

- `prompts`: building a prompt batch as EasyR1 does (chat template, images, position ids).
- `dataset`: converting document-QA JSON into the trainer's parquet.
- `writing`: the converted columns written: the validation split and each trainer's parquet layout.
- `questions`: reading a converted dataset back as prompt samples and ground truths (`learn --data`).
- `convert_command`: `vrag-rollout convert-dataset`, the command around `dataset` (summary, warnings, exit codes).
- `sources`: reading the public document-QA sets (SlideVQA, MMLongBench-Doc, MMDocIR, LongDocURL,
  ViDoSeek) in their own released layouts into `dataset`'s question records, and their document lists.
- `output_path`: refusing a mistyped `--out` (more than its last directory missing).
- `question_text`: a questions file's text, or what the file is instead (a PDF, a parquet, not UTF-8).
- `json_numbers`: JSON whose numbers keep their source text (an answer "3.50" stays "3.50").
- `fixture_calls`: recording the retriever calls a converted dataset's questions can make, for replay.
- `merge`: `convert-dataset --merge`: several converted sets as one corpus-scope file, each row's origin kept.
"""
