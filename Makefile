# Two commands do all set-up on a fresh machine:
#   make run    start strom on embedded defaults (127.0.0.1:9123, data in ./strom-data)
#   make test   run the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
BUILD_INPUTS := pyproject.toml setup.py $(wildcard scripts/*.sh) $(wildcard strom/rpc/proto/*.proto) $(wildcard strom/*/native/*.c)

NEMESIS_SEEDS ?= 1-100
NEMESIS_FAULTS ?= 12

.PHONY: install run test lint bench nemesis clean

install: $(STAMP)

$(STAMP): $(BUILD_INPUTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# RocksDB 9.10 for strom's own binding: built once per machine (7-8 min on 2 cores), then cached
	rocksdb="$$(scripts/build-rocksdb.sh)" && STROM_ROCKSDB_DIR="$$rocksdb" $(BIN)/python -m pip install -e '.[dev,spark,zookeeper,lance,paimon,gateway]'
	# ZooKeeper (Debian's package) for the metadata tests and the local cluster; skipped where apt is not usable
	scripts/install-zookeeper.sh
	# Chromium and chromedriver (Debian's packages) for the console's browser tests; skipped where apt is not usable
	scripts/install-chromium.sh
	# pypaimon 2.1.0, the tests' independent reader of Paimon tables: a virtualenv of its own (it pins pyarrow < 20)
	test -x .venv-pypaimon/bin/python || $(PYTHON) -m venv .venv-pypaimon
	.venv-pypaimon/bin/python -m pip install --quiet 'pypaimon==2.1.0'
	touch $(STAMP)

run: install
	$(BIN)/strom server --bind 127.0.0.1:9123 --data-dir strom-data

test: install
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=25

lint: install
	$(BIN)/ruff check strom tests bench
	$(BIN)/mypy strom

# the nemesis's long profile (docs/reliability.md): a cluster per seed under random faults; hours for 100 seeds
nemesis: install
	$(BIN)/python -m tests.nemesis.run --seeds $(NEMESIS_SEEDS) --faults $(NEMESIS_FAULTS) --report nemesis-report.json

bench: install
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info strom/rpc/proto/*_pb2.py strom/*/*.so
