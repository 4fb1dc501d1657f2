#!/usr/bin/env bash
# The conformance suite in all three runtimes, over ONE built component file.
#
#   tests/conformance/run-all.sh            # the component cargo builds (host/once/build.rs)
#   ONCE_COMPONENT=path/to/once.wasm tests/conformance/run-all.sh   # a prebuilt one
#
# Installs the pinned Python (requirements.txt) and npm (package-lock.json)
# dependencies, runs the Rust (wasmtime crate), Python (wasmtime from PyPI)
# and Node.js (jco) runners over the same .wasm, each on an in-memory and a
# SQLite store plus the deliberately broken stores, and each on the other
# ledger encoding (typed / ledger-json) over memory, requires their nine
# transcripts to be byte-identical, runs the two embedding examples (twice
# each, over one durable ledger file: the second run only replays), and
# fails if any runner is skipped or runs no scenario. Closes with
# "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/../.."

out=target/conformance
scenarios=tests/conformance/scenarios
mkdir -p "$out"

step() { printf '\n== conformance: %s\n' "$*"; }
die() {
  echo "conformance: $*" >&2
  echo "0 passed, 1 failed"
  exit 1
}
sha() { sha256sum "$1" | cut -d' ' -f1; }

expected=$(find "$scenarios" -maxdepth 1 -name '*.json' | wc -l)
[[ "$expected" -ge 40 ]] || die "only $expected scenario files in $scenarios"

step "Python dependencies (pinned)"
python=${PYTHON:-python3}
venv=$out/venv
stamp=$(cat tests/conformance/python/requirements.txt examples/python/requirements.txt | sha256sum | cut -d' ' -f1)
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.once-stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet \
    -r tests/conformance/python/requirements.txt -r examples/python/requirements.txt
  echo "$stamp" >"$venv/.once-stamp"
fi
"$venv/bin/python" --version
"$venv/bin/python" -m pip freeze --disable-pip-version-check

step "npm dependencies (package-lock.json)"
node --version
for dir in tests/conformance/node examples/node; do
  stamp=$(sha "$dir/package-lock.json")
  if [[ "$(cat "$dir/node_modules/.once-stamp" 2>/dev/null)" != "$stamp" ]]; then
    (cd "$dir" && npm ci --no-audit --no-fund)
    echo "$stamp" >"$dir/node_modules/.once-stamp"
  fi
done

transcripts=$PWD/$out/transcripts
rm -rf "$transcripts"
mkdir -p "$transcripts"
total_passed=0
total_failed=0
# Adds a runner's closing "<name>: N passed, M failed" line to the totals.
tally() {
  local line passed failed
  line=$(grep -E '^[a-z]+: [0-9]+ passed, [0-9]+ failed' "$1" | tail -1 || true)
  [[ -n "$line" ]] || die "$2 printed no closing line (skipped?)"
  passed=$(sed -E 's/^[a-z]+: ([0-9]+) passed.*/\1/' <<<"$line")
  failed=$(sed -E 's/^[a-z]+: [0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")
  [[ "$passed" -gt 0 ]] || die "$2 ran no scenario"
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
}

step "Rust runner (wasmtime crate, host/once/tests/conformance.rs) over the component cargo built"
# The same selection as the README's `cargo test --workspace` (no rebuild after
# it): host/once/build.rs builds the component (or takes $ONCE_COMPONENT), the Rust
# runner loads that file and names it in component.txt for the other runners.
if [[ -n "${ONCE_COMPONENT:-}" ]]; then
  export ONCE_CONFORMANCE_COMPONENT=$ONCE_COMPONENT
fi
set +e
ONCE_CONFORMANCE_TRANSCRIPTS=$transcripts \
  cargo test --locked --workspace --test conformance -- --nocapture --test-threads 1 2>&1 | tee "$out/rust.log"
rust_status=${PIPESTATUS[0]}
set -e
rust_scenarios=$(grep -E '^rust \((memory|sqlite), (typed|json)\): [0-9]+ passed' "$out/rust.log" |
  sed -E 's/.*: ([0-9]+) passed.*/\1/' | awk '{ n += $1 } END { print n + 0 }')
rust_tests=$(grep -E '^test result: ok\. [0-9]+ passed' "$out/rust.log" | sed -E 's/test result: ok\. ([0-9]+) passed.*/\1/' || true)
[[ "$rust_status" -eq 0 ]] || die "the Rust runner failed"
[[ "$rust_scenarios" -gt 0 ]] || die "the Rust runner ran no scenario"
echo "rust: $((rust_scenarios + rust_tests - 1)) passed, 0 failed" | tee -a "$out/rust.log"
tally "$out/rust.log" rust
wasm=$(cat "$transcripts/component.txt" 2>/dev/null || true)
[[ -s "$wasm" ]] || die "the Rust runner named no component file"
digest=$(sha "$wasm")
echo "component: $wasm sha256 $digest"

step "Python runner (wasmtime from PyPI)"
set +e
"$venv/bin/python" tests/conformance/python/run.py --component "$wasm" --transcripts "$transcripts" --negative 2>&1 |
  tee "$out/python.log"
python_status=${PIPESTATUS[0]}
set -e
tally "$out/python.log" python
[[ "$python_status" -eq 0 ]] || die "the Python runner failed"

step "Node.js runner (jco transpile)"
set +e
(cd tests/conformance/node && node run.mjs --component "$wasm" --transcripts "$transcripts" --negative) 2>&1 |
  tee "$out/node.log"
node_status=${PIPESTATUS[0]}
set -e
tally "$out/node.log" node
[[ "$node_status" -eq 0 ]] || die "the Node.js runner failed"

step "byte-identical decisions, receipts and records across runners and stores"
reference=$transcripts/rust-memory.jsonl
for runner in rust python node; do
  for store in memory sqlite; do
    file=$transcripts/$runner-$store.jsonl
    [[ -s "$file" ]] || die "no transcript $file (a runner was skipped)"
    ran=$(grep -o '"scenario":"[^"]*"' "$file" | sort -u | wc -l)
    [[ "$ran" -eq "$expected" ]] || die "$file covers $ran of $expected scenarios"
    cmp -s "$reference" "$file" || die "$file differs from $reference"
    printf '%s  %s (%s scenarios, %s steps)\n' "$(sha "$file")" "$file" "$ran" "$(wc -l <"$file")"
  done
done
# Each runner on its other ledger encoding too (Rust, Node: ledger-json; Python: the typed ledger).
for file in rust-memory-json python-memory-typed node-memory-json; do
  [[ -s "$transcripts/$file.jsonl" ]] || die "no transcript $transcripts/$file.jsonl (a runner skipped an encoding)"
  cmp -s "$reference" "$transcripts/$file.jsonl" || die "$transcripts/$file.jsonl differs from $reference"
  printf '%s  %s\n' "$(sha "$transcripts/$file.jsonl")" "$transcripts/$file.jsonl"
done
total_passed=$((total_passed + 1))

step "examples (a durable ledger: the first run sends the refund once, a second run over the same file only replays)"
# Runs an example twice over a fresh ledger file: "$1" names it, the rest is the command (ledger path last).
example() {
  local name=$1 ledger=$PWD/$out/example-$1.db first second
  shift
  rm -f "$ledger" "$ledger"-* "$ledger".witness*
  first=$("$@" "$ledger") || die "examples/$name failed: $first"
  printf '%s\n' "$first"
  grep -q '^sent 1 time(s) by this run$' <<<"$first" || die "examples/$name did not send the refund exactly once"
  second=$("$@" "$ledger") || die "examples/$name failed on its second run: $second"
  printf '%s\n' "$second"
  grep -q '^sent 0 time(s) by this run$' <<<"$second" || die "examples/$name sent again over its durable ledger"
  total_passed=$((total_passed + 1))
}
example python "$venv/bin/python" examples/python/protect.py "$wasm"
(cd examples/node && rm -rf gen && npx --no-install jco transpile "$wasm" -o gen --instantiation sync --name once --quiet) ||
  die "examples/node: jco transpile failed"
example node node examples/node/protect.mjs examples/node/gen

step "done: component sha256 $digest"
echo "$total_passed passed, $total_failed failed"
[[ "$total_failed" -eq 0 ]]
