# The two commands of the README. Both build .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint setup docs

# The dashboard's test drives a real headless Chromium: Debian's package.
CHROMIUM := /usr/bin/chromium
# The scale-out tests run a real PgBouncer, and hosts in network namespaces.
PGBOUNCER := /usr/sbin/pgbouncer
IPROUTE := /usr/sbin/ip
# The failover tests run PostgreSQL under Patroni (PyPI, the dev extra) with etcd.
ETCD := /usr/bin/etcd
# The plan tests check the plans on an older PostgreSQL too: Debian's 15.
OLDER_PG := /usr/lib/postgresql/15/bin/pg_ctl
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# An editable install leaves src without bytecode, and where
	# PYTHONDONTWRITEBYTECODE is set nothing writes it: each worker process
	# would compile every module at each start (about 0.1 s of CPU).
	$(PY) -m compileall -q src
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/pgqueue up

lint: setup
	$(VENV)/bin/ruff check src tests bench harness examples docs/hooks
	$(VENV)/bin/ruff format --check src tests bench harness examples docs/hooks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml), strict: a broken link or any warning fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

$(PGBOUNCER) $(IPROUTE) $(ETCD):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer iproute2 etcd-server >/dev/null

$(OLDER_PG):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null

test: setup lint docs $(CHROMIUM) $(PGBOUNCER) $(IPROUTE) $(OLDER_PG)
	$(VENV)/bin/pytest

# The failover tests (tests/ha.py) need etcd too.
test: $(ETCD)

# The generated-client test (tests/integration/api/test_api_generated_client.py)
# runs openapi-python-client (PyPI) and the client it generates in a venv of
# their own: the generator pins httpx and typer below the dev venv's versions.
OPENAPI_GEN := .venv-openapi/bin/openapi-python-client
$(OPENAPI_GEN):
	python3 -m venv .venv-openapi
	.venv-openapi/bin/python -m pip install --quiet "openapi-python-client==0.29.1" python-dateutil
test: $(OPENAPI_GEN)
