#!/usr/bin/env bash
# The packages as a user installs them, with no Rust: the wheel and the sdist each into a fresh venv,
# the npm tarball into an empty npm project, then the README's quick start run from each, twice.
#
#   tests/packages/run.sh dist/once_exactly-0.2.0-py3-none-any.whl dist/once_exactly-0.2.0.tar.gz once-exactly-0.2.0.tgz
#
# Every install and run is under `env -i` with PATH=<venv>/bin:/usr/bin:/bin and a HOME of its own:
# no ~/.cargo/bin, no rustup; `cargo` and `rustc` are checked to be absent first. Kept from the
# outside: the machine's package-registry settings (PIP_* variables, ~/.npmrc) and the download
# caches (pip's, npm's), nothing else. The quick starts are the first ```python block under
# "## Quick start" in python/README.md and the first ```js block under it in js/README.md, as
# printed (readme_block.py): a README that drifts from the package fails here, and so does the
# repository's README.md if its "### Python" or "### Node.js" quick start is not the same. Each must print its
# receipt twice and `sent 1 time(s) by this run`, and run again over the same ledger,
# `sent 0 time(s) by this run` — what both READMEs say it does.
set -euo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 WHEEL SDIST NPM_TARBALL" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
wheel="$(realpath "$1")" sdist="$(realpath "$2")" tarball="$(realpath "$3")"
for f in "$wheel" "$sdist" "$tarball"; do [[ -f "$f" ]] || { echo "packages: $f: no such file" >&2; exit 1; }; done
python="${ONCE_PACKAGES_PYTHON:-python3}"  # makes the venvs; the venv's python runs without PATH
work="$(mktemp -d "${TMPDIR:-/tmp}/once-packages.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Runs "$@" in a clean environment: PATH=$1:/usr/bin:/bin (no Rust), HOME=$work/home.
clean() {
  local bin="$1"; shift
  local keep=(PATH="$bin:/usr/bin:/bin" HOME="$work/home" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}"
    PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}" npm_config_cache="${npm_config_cache:-$HOME/.npm}")
  local v
  for v in $(compgen -e); do
    case "$v" in PIP_*|SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE|NODE_EXTRA_CA_CERTS|HTTPS_PROXY|HTTP_PROXY|NO_PROXY|https_proxy|http_proxy|no_proxy) keep+=("$v=${!v}");; esac
  done
  [[ -f "$HOME/.npmrc" ]] && keep+=(NPM_CONFIG_USERCONFIG="$HOME/.npmrc")
  env -i "${keep[@]}" "$@"
}

norust() {
  clean "$1" bash -c 'for t in cargo rustc rustup; do if command -v "$t"; then echo "packages: $t is on PATH ($(command -v "$t")): the install must not need Rust" >&2; exit 1; fi; done'
}

# Runs a quick start (in $1, with $2 on PATH: the rest is the command) and checks its output: the
# receipt printed twice, then `sent $sent time(s) by this run`. A failing run fails here.
expect() {
  local dir="$1" bin="$2" sent="$3" what="$4" out; shift 4
  if ! out="$(cd "$dir" && clean "$bin" "$@")"; then
    printf 'packages: %s failed; its output:\n%s\n' "$what" "$out" >&2
    exit 1
  fi
  local lines; mapfile -t lines <<<"$out"
  if [[ ${#lines[@]} -lt 3 || "${lines[0]}" != "${lines[1]}" || "${lines[-1]}" != "sent $sent time(s) by this run" ]]; then
    printf 'packages: %s: expected the receipt twice, then "sent %s time(s) by this run"; got:\n%s\n' "$what" "$sent" "$out" >&2
    exit 1
  fi
  echo "  $what: ${lines[0]} (twice); ${lines[-1]}"
}

mkdir -p "$work/home"
"$python" "$here/readme_block.py" "$repo/python/README.md" "## Quick start" python >"$work/quickstart.py"
"$python" "$here/readme_block.py" "$repo/js/README.md" "## Quick start" js >"$work/quickstart.mjs"
# The repository's README prints the same two quick starts: a newcomer who copies them from there runs these.
"$python" "$here/readme_block.py" "$repo/README.md" "### Python" python | cmp -s - "$work/quickstart.py" ||
  { echo "packages: README.md's Python quick start is not python/README.md's" >&2; exit 1; }
"$python" "$here/readme_block.py" "$repo/README.md" "### Node.js" js | cmp -s - "$work/quickstart.mjs" ||
  { echo "packages: README.md's Node.js quick start is not js/README.md's" >&2; exit 1; }

for artifact in "$wheel" "$sdist"; do
  name="$(basename "$artifact")"
  echo "== packages: pip install $name in a fresh venv, no Rust on PATH"
  venv="$work/venv-$name"
  "$python" -m venv "$venv"
  norust "$venv/bin"
  clean "$venv/bin" python -m pip install --quiet --disable-pip-version-check "$artifact"
  clean "$venv/bin" python -c 'import importlib.resources as r, once; assert r.files("once").joinpath("once_guest.wasm").is_file(), "no once_guest.wasm in the installed package"'
  # The ledger's DDL (the repository's schema/), which the SQLite and PostgreSQL ledgers load from the package.
  clean "$venv/bin" python -c 'import importlib.resources as r, once; s = r.files("once") / "schema"; assert (s / "sqlite" / "ledger.sql").is_file() and (s / "postgres" / "001-ledger.sql").is_file(), "no schema/ in the installed package"'
  run="$work/run-$name"; mkdir -p "$run"; cp "$work/quickstart.py" "$run/"
  expect "$run" "$venv/bin" 1 "python/README.md quick start from $name" python quickstart.py
  expect "$run" "$venv/bin" 0 "python/README.md quick start from $name, run again" python quickstart.py
done

name="$(basename "$tarball")"
echo "== packages: npm install $name in an empty npm project, no Rust on PATH"
project="$work/npm-project"; mkdir -p "$project"
norust /usr/bin
(cd "$project" && clean /usr/bin npm init -y >/dev/null && clean /usr/bin npm install --no-audit --no-fund --loglevel=error "$tarball" >/dev/null)
for f in sqlite/ledger.sql postgres/001-ledger.sql; do
  [[ -f "$project/node_modules/once-exactly/schema/$f" ]] || { echo "packages: no schema/$f in the installed npm package" >&2; exit 1; }
done
cp "$work/quickstart.mjs" "$project/"
expect "$project" /usr/bin 1 "js/README.md quick start from $name" node quickstart.mjs
expect "$project" /usr/bin 0 "js/README.md quick start from $name, run again" node quickstart.mjs
echo "packages: the wheel, the sdist and the npm tarball install and run their README's quick start without Rust"
