#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, then lints and runs pytest.
# torch is pinned to 2.13.0 so pip takes the CPU build instead of a multi-GB CUDA one.
# Exits non-zero on any failure, and also when no test ran (pytest exit 5).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
T0=$SECONDS
say() { echo "run_all: $* [$((SECONDS - T0)) s]" >&2; }
say "the test venv (.venv: Python $("$PY" -c 'import platform; print(platform.python_version())'), torch 2.13.0 CPU, the package with its test extra)"
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[test]"
# the npm skills CLI for the install test; 1.5.18 is the newest that runs on Node 20. Without npm
# the install test fails rather than skips (MBR_NO_NODE=1 opts out on a machine without Node)
if command -v npm >/dev/null 2>&1; then
  say "the npm skills CLI 1.5.18 (.tools/)"
  npm install --silent --no-audit --no-fund --prefix .tools skills@1.5.18 >/dev/null
elif [ "${MBR_NO_NODE:-}" != "1" ]; then
  echo "npm is missing: tests/test_install.py needs the skills CLI (set MBR_NO_NODE=1 to skip it)" >&2
  exit 1
fi
# one environment per megatron-core release (and Megatron Bridge 0.6.2) for tests/test_releases.py;
# kept outside the checkout, so a fresh clone reuses what an earlier run built
export MBR_ENVS=${MBR_ENVS:-$HOME/.cache/mbridge-recompute/envs}
say "per-release environments (tests/envs/build.sh; its progress follows)"
bash tests/envs/build.sh >/dev/null      # stdout: the envs.json path; progress goes to stderr
# Megatron-LM and Megatron Bridge source at their tags, which no package carries, from bare git
# clones (tests/tools/mirrors.py): a missing one is cloned when GitHub answers; otherwise the
# tests that read it fail, naming it
while IFS=$'\t' read -r var path url; do
  if [ ! -f "$path/HEAD" ]; then
    say "the $var git mirror ($url into $path)"
    timeout 900 git clone --quiet --bare "$url" "$path" 2>/dev/null ||
      echo "run_all: could not clone $url: the tests that read $var will fail" >&2
  fi
done < <("$PY" tests/tools/mirrors.py)
# lint first (ruff, configured in pyproject.toml): a lint error fails the run like a test
say "lint (ruff)"
.venv/bin/python -m ruff check scripts tests benchmarks
say "pytest"
set +e
.venv/bin/python -m pytest -n 2 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "no tests ran: failing" >&2; exit 1; fi
exit "$rc"
