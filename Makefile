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

# Two workers at most (each holds its own engines, about 3 GB), whole modules each
# (tests/xdist_schedule.py); the background work runs beside them (tests/background.py).
test: setup
	$(PY) -m pytest -n auto --maxprocesses 2

# The pure tier, on every core: no vLLM engine or model (`engine`), no subprocess or server
# (`process`), no long stress run (`stress`); tests/conftest.py fails a test that strays.
test-fast: setup
	$(PY) -m pytest -m "not engine and not process and not stress" -n auto

bench: setup
	$(PY) scripts/bench_observation.py
	$(PY) scripts/bench_retriever.py
	$(PY) scripts/bench_schedules.py
	$(PY) scripts/bench_pages.py
	$(PY) scripts/bench_encoder.py
	$(PY) scripts/bench_context.py

# Corpus scale (several minutes each): BM25 corpus search, then dense late interaction, at
# 2,000 and 20,000 generated pages.
bench-corpus: setup
	$(PY) scripts/bench_corpus.py
	$(PY) scripts/bench_dense_corpus.py
