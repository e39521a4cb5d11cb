# Entry points that work on a fresh machine: `make tune` (the whole model), `make tune-op` and `make test`.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

# `make tune`: the whole DLRM (examples/dlrm.py) tuned on this CPU and timed against PyTorch's own ways to run
# it, one table per pooling. TRIALS per task, for the tasks the shipped records (logs/cpu/) do not cover: a first
# run on 2 cores takes 5-10 minutes where they cover every task (install included), 11-14 where none cover
# any (the default BUDGET); a second run resumes from MODEL_LOG and tunes nothing already tuned.
TRIALS  ?= 8
# BUDGET=SECONDS: each tune_model call tunes for that long, each task's first 4 configs, then batch by batch where
# the model's time goes (TRIALS then caps each task); BUDGET= (empty): every task gets TRIALS configs. Where the
# shipped records cover every task it changes nothing; on a CPU kind without records, 90 s a call took 11-14 min
# with the install (benchmarks/WHOLE_MODEL.md).
BUDGET  ?= 90
# RETUNE=1: tune the tasks the shipped records cover too (they then only compete with what this run measures).
RETUNE  ?=
TUNING  := --trials $(TRIALS) $(if $(BUDGET),--budget $(BUDGET)) $(if $(RETUNE),--retune)
POOLING ?= 1 8
MODEL_LOG ?= logs/local/dlrm
# `make tune-op`: one operator, embedding-bag, tuned at a DLRM shape, then benchmarked against PyTorch.
SHAPE   ?= rows=1000000,dim=64,batch=2048,pooling=20-80,dist=zipf:1.05
OP_TRIALS ?= 96
# Your own runs go to logs/local/ (ignored by git); logs/cpu/ holds the shipped records.
LOG     ?= logs/local/embedding_bag.jsonl

.PHONY: tune tune-op test install clean readme-table

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	# the torch ops' compiled call path, built once per machine (~20 s) rather than by the first op call
	$(BIN)/python -c "import autotune.torch"
	touch $(STAMP)

install: $(STAMP)

# The peers (pyproject's `peers` extra: PyTorch's own int8 for the model's PT2E row, FBGEMM's TBE for the
# embedding bag's bench), without their dependencies: they would otherwise replace the pinned torch. Offline,
# their rows are skipped and say why.
PEERS   := $(VENV)/.peers
$(PEERS): $(STAMP)
	$(BIN)/pip install -q --no-deps 'torchao==0.18.0' || echo "torchao not installed: the PT2E row will be skipped"
	$(BIN)/pip install -q --no-deps 'fbgemm-gpu-cpu==1.8.0' || echo "fbgemm-gpu-cpu not installed: no FBGEMM peer"
	touch $(PEERS)

# TorchRec (pyproject's `torchrec` extra, --no-deps as the peers): the TorchRec models' tests need it, so `make
# test` installs it too.
TORCHREC := $(VENV)/.torchrec
TORCHREC_PINS := torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0 tensordict==0.15.3 pyvers==0.2.3 pyre-extensions==0.0.32 \
                 typing_inspect==0.9.0 mypy_extensions==1.2.0
$(TORCHREC): $(STAMP)
	$(BIN)/pip install -q --no-deps $(TORCHREC_PINS)
	touch $(TORCHREC)

# `make tune EXAMPLE=torchrec`: TorchRec's own DLRM and DLRM_DCN (MLPerf's DLRMv2) instead
# (examples/torchrec_dlrm.py; TORCHREC_MODELS picks them).
EXAMPLE ?= dlrm
TORCHREC_MODELS ?= dlrm dcn
tune: $(STAMP) $(PEERS) $(TORCHREC)
ifeq ($(EXAMPLE),torchrec)
	$(BIN)/python examples/torchrec_dlrm.py $(TUNING) --model $(TORCHREC_MODELS) --log-dir logs/local/torchrec
else
	$(BIN)/python examples/dlrm.py $(TUNING) --pooling $(POOLING) --log-dir $(MODEL_LOG)
endif

# `make readme-table`: the README's whole-model table becomes the last `make tune`'s summary (MODEL_LOG/summary.md,
# stamped with its commit, CPU, date and command); refused unless that run was at the code checked out here.
readme-table:
	$(BIN)/python -m autotune.provenance $(MODEL_LOG)/summary.md README.md

tune-op: $(STAMP) $(PEERS)
	$(BIN)/autotune tune embedding_bag --device cpu --shape $(SHAPE) --trials $(OP_TRIALS) --log $(LOG)
	$(BIN)/autotune bench embedding_bag --device cpu --shape $(SHAPE) --log $(LOG)

# One pytest worker per core (pytest-xdist): the suite is mostly compiling, 17 minutes serially on 2 cores,
# 12 with two workers. Work stealing: an idle worker takes tests queued for the busy one, so a few minute-long
# tests at the end of one worker's share no longer leave the other idle.
test: $(STAMP) $(TORCHREC)
	$(BIN)/python -m pytest -q -n auto --dist worksteal

clean:
	rm -rf $(VENV) *.egg-info
