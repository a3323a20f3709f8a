# Every target sets up .venv first (idempotent; a few minutes on a fresh machine).
PY := .venv/bin/python

.PHONY: setup demo learn test test-fast bench bench-corpus
setup:
	bash scripts/setup.sh

FAMILY ?= qwen2-vl
ACTION_FORMAT ?= tags

demo: setup
	.venv/bin/vrag-rollout demo --family $(FAMILY) --action-format $(ACTION_FORMAT)

learn: setup
	.venv/bin/vrag-rollout learn --family $(FAMILY) --action-format $(ACTION_FORMAT)

test: setup
	$(PY) -m pytest

# The tests that start no vLLM engine and run no model (tests/conftest.py marks the others
# `engine`), on every core.
test-fast: setup
	$(PY) -m pytest -m "not engine" -n auto

bench: setup
	$(PY) scripts/bench_observation.py
	$(PY) scripts/bench_retriever.py
	$(PY) scripts/bench_schedules.py
	$(PY) scripts/bench_pages.py
	$(PY) scripts/bench_encoder.py

# Corpus scale (several minutes each): BM25 corpus search, then dense late interaction, at
# 2,000 and 20,000 generated pages.
bench-corpus: setup
	$(PY) scripts/bench_corpus.py
	$(PY) scripts/bench_dense_corpus.py
