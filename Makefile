# Two entry points that work on a fresh machine: `make tune` and `make test`.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

# A real tuning run on this machine's CPU at a DLRM shape, with a modest budget.
SHAPE   ?= rows=1000000,dim=64,batch=2048,pooling=20-80,dist=zipf:1.05
TRIALS  ?= 96
# Your own runs go to logs/local/ (ignored by git); logs/cpu/ holds the shipped records.
LOG     ?= logs/local/embedding_bag.jsonl

.PHONY: tune test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	# the torch ops' compiled call path, built once per machine (~20 s) rather than by the first op call
	$(BIN)/python -c "import autotune.torch"
	touch $(STAMP)

install: $(STAMP)

tune: $(STAMP)
	$(BIN)/autotune tune embedding_bag --device cpu --shape $(SHAPE) --trials $(TRIALS) --log $(LOG)
	$(BIN)/autotune bench embedding_bag --device cpu --shape $(SHAPE) --log $(LOG)

# One pytest worker per core (pytest-xdist): the suite is mostly compiling, 17 minutes serially on 2 cores,
# 12 with two workers.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

clean:
	rm -rf $(VENV) *.egg-info
