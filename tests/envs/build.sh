#!/usr/bin/env bash
# Build (or reuse) one CPU Python environment per megatron-core release the card covers, for the
# per-release tests (tests/test_releases.py), and write $MBR_ENVS/envs.json naming each
# release's python and PYTHONPATH.
#
#   0.16.1          the test venv itself (.venv, Python 3.11, torch 2.13.0+cpu) -- made by run_all.sh
#   0.17.1 .. 0.19.2  one Python 3.12 venv (py312-base: torch 2.13.0, numpy, packaging, triton)
#                   shared by all three, each release in its own `--no-deps --target` directory
#                   selected with PYTHONPATH (megatron/ is a namespace package, so they stack)
#   bridge-0.6.2    megatron-bridge 0.6.2 and the pure-Python packages its config, recipe and
#                   override (hydra-core: training/utils/omegaconf_utils.py) modules import, as a
#                   --target layer over 0.19.2 (plus the Transformer Engine stand-in under
#                   tests/standins)
#
# Torch for Python 3.12: the registry reachable here serves only the CUDA build of torch 2.13.0
# for 3.12 (the CPU wheel of this machine is cp311); it imports and runs on a CPU. The envs live
# outside the checkout ($MBR_ENVS, default ~/.cache/mbridge-recompute/envs) so that a fresh clone
# reuses them; each is keyed by a hash of its pin file and marked complete only when built.
# uv is used because it keeps a wheel cache (pip's stays empty against this registry).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PINS=$HERE/pins
ROOT=${MBR_ENVS:-$HOME/.cache/mbridge-recompute/envs}
mkdir -p "$ROOT/t"
export UV_CACHE_DIR=${UV_CACHE_DIR:-$ROOT/uv-cache} UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=hardlink UV_NO_PROGRESS=1
# progress on stderr (stdout carries only the path of envs.json): a first build downloads
# ~5 GB and takes minutes, and says so while it runs
T0=$SECONDS
say() { echo "envs: $* [$((SECONDS - T0)) s]" >&2; }
say "per-release environments under $ROOT (a first build downloads ~5 GB; later runs reuse them)"
PY312=$(PYENV_VERSION=3.12.1 python3 -c \
  'import sys; print(sys.executable if sys.version_info[:2] == (3, 12) else "")' 2>/dev/null || true)
if [ -z "$PY312" ]; then
  echo "envs: Python 3.12 is needed for megatron-core 0.17-0.19 and Bridge 0.6.2 (pyenv install 3.12.1)" >&2
  exit 1
fi
UV=$ROOT/uv-0.13.8/bin/uv
if [ ! -x "$UV" ]; then
  say "installing uv 0.13.8 (the installer the builds use; it keeps a wheel cache)"
  rm -rf "$ROOT/uv-0.13.8"
  python3 -m pip install -q --no-deps --target "$ROOT/uv-0.13.8" uv==0.13.8
fi
KEY_VERSION=1
key() { { echo "$KEY_VERSION"; cat "$@"; } | sha256sum | cut -c1-12; }

venv() {  # venv NAME PYTHON PINFILE -> path of a complete venv
  local name=$1 py=$2 pins=$3
  local d=$ROOT/$name-$(key "$pins" <(echo "$py"))
  if [ ! -f "$d/.complete" ]; then
    say "building $name from $(basename "$pins") (torch for Python 3.12 and its CUDA libraries: the bulk of the download)"
    rm -rf "$d"
    "$UV" venv -q -p "$py" "$d"
    # bytecode now: PYTHONDONTWRITEBYTECODE may be set, and every import would pay for it
    "$UV" pip install -q --compile-bytecode -p "$d/bin/python" -r "$pins"
    touch "$d/.complete"
    say "built $name ($(du -sh "$d" 2>/dev/null | cut -f1))"
  else
    say "reusing $(basename "$d")"
  fi
  for old in "$ROOT/$name"-*; do [ "$old" = "$d" ] || rm -rf "$old"; done
  echo "$d"
}

target() {  # target NAME BASE PINFILE -> path of a complete --target directory
  local name=$1 base=$2 pins=$3
  local d=$ROOT/t/$name-$(key "$pins" <(echo "$base"))
  if [ ! -f "$d/.complete" ]; then
    say "building $name from $(basename "$pins")"
    rm -rf "$d"
    "$UV" pip install -q --compile-bytecode --no-deps -p "$base/bin/python" --target "$d" -r "$pins"
    touch "$d/.complete"
    say "built $name ($(du -sh "$d" 2>/dev/null | cut -f1))"
  else
    say "reusing $(basename "$d")"
  fi
  for old in "$ROOT/t/$name"-*; do [ "$old" = "$d" ] || rm -rf "$old"; done
  echo "$d"
}

BASE=$(venv py312-base "$PY312" "$PINS/py312-base.txt")
declare -A PP
for v in 0.17.1 0.18.2 0.19.2; do
  PP[$v]=$(target "mcore-$v" "$BASE" "$PINS/mcore-$v.txt")
done
BRIDGE=$(target bridge-0.6.2 "$BASE" "$PINS/bridge-0.6.2.txt")

# 0.16.1 is named relative to the checkout (each checkout runs its own .venv) and the bridge
# path carries no stand-in: the environments are shared by every checkout on the machine, so the
# manifest names nothing that lives inside one (tests/bridge_env.py adds this checkout's stand-in)
python3 - "$ROOT/envs.json" "$BASE" "${PP[0.17.1]}" "${PP[0.18.2]}" "${PP[0.19.2]}" "$BRIDGE" <<'EOF'
import json, sys
out, base, p171, p182, p192, bridge = sys.argv[1:]
envs = {
    "0.16.1": {"python": ".venv/bin/python", "pythonpath": ""},
    "0.17.1": {"python": f"{base}/bin/python", "pythonpath": p171},
    "0.18.2": {"python": f"{base}/bin/python", "pythonpath": p182},
    "0.19.2": {"python": f"{base}/bin/python", "pythonpath": p192},
    "bridge-0.6.2": {"python": f"{base}/bin/python", "megatron_core": "0.19.2",
                     "pythonpath": ":".join([p192, bridge])},
}
# written whole and then moved into place: a test reading it meanwhile sees the old or the new file
import os
with open(out + ".tmp", "w") as fh:
    json.dump(envs, fh, indent=1)
os.replace(out + ".tmp", out)
print(out)
EOF
