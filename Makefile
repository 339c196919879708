# Two commands on a fresh machine: `make run` and `make test`. Both create .venv and install
# the pinned requirements first; nothing else needs to be installed by hand.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run smoke test lint bench soak clean pgbouncer

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt -r requirements-dev.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m bot

# A real chat model's four-turn check (docs/models.md): needs CHAT_BASE_URL and CHAT_MODEL.
smoke: $(STAMP)
	$(PY) -m bot smoke

# The PgBouncer tests (tests/test_pgbouncer.py and the PgBouncer runs of the concurrency and load tests) need
# Debian's pgbouncer. Installed here when missing and possible; where it cannot be, those tests skip with the reason.
pgbouncer:
	@command -v pgbouncer >/dev/null 2>&1 || test -x /usr/sbin/pgbouncer || \
		( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer) >/dev/null 2>&1 \
		  || echo "pgbouncer could not be installed: the PgBouncer tests will be skipped" )

test: $(STAMP) pgbouncer
	$(VENV)/bin/ruff check .
	$(PY) -m mypy
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

# Benchmarks (docs/benchmarks.md): `make bench`, or `make bench QUICK=1` for a laptop.
bench: $(STAMP)
	$(PY) -m bench $(if $(QUICK),--quick,)

# Full-size reliability runs (docs/reliability.md): the load test with 4 workers (2 of them OS
# processes) over 11 simulated days, and the bad-input fuzzing with many more examples. Takes minutes;
# the figures go to data/soak-report.json.
soak: $(STAMP) pgbouncer
	mkdir -p data
	DESKMATE_SOAK=1 DESKMATE_LOAD_REPORT=data/soak-report.json $(PY) -m pytest -q -s tests/test_load.py tests/test_bad_input.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
