#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Runs the golden cases of unit_tests/data through two builds of the `kdnn`
# command-line tool and compares every output file byte for byte: a
# refactor that must change no number (one built before it, one after).
#
#   bash scripts/compare-cli.sh OLD_KDNN NEW_KDNN
#
# The cases: the attention layer's four golden cases (fused and unfused),
# the Sinkhorn's (forward and each backward), the SSD's and the conv's (on
# one rank and on two, under mpiexec). Prints one line per run and exits 1
# when any output differs or a run fails.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
old=$(realpath "${1:?usage: compare-cli.sh OLD_KDNN NEW_KDNN}")
new=$(realpath "${2:?usage: compare-cli.sh OLD_KDNN NEW_KDNN}")
data=unit_tests/data
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi=(mpiexec --oversubscribe -n 2)
# The environment the MPI tests run in (ctest's), e.g. Open MPI as root.
mapfile -t mpi_environment < <(grep "^[A-Za-z_]" cmake/mpi-test-environment)
export "${mpi_environment[@]}"
failures=0 runs=0

# compare NAME LAUNCHER... -- ARGS...: runs both tools on $work/in, each
# into its own directory, and compares what they wrote.
compare() {
  local name=$1
  shift
  local launcher=()
  while [[ $1 != -- ]]; do launcher+=("$1"); shift; done
  shift
  local side status=()
  for side in old new; do
    rm -rf "$work/$side" && mkdir "$work/$side"
    local tool=$old
    [[ $side == new ]] && tool=$new
    if "${launcher[@]}" "$tool" "$@" --in "$work/in" --out "$work/$side" >/dev/null 2>"$work/$side.err"; then
      status+=(0)
    else
      status+=(1)
    fi
  done
  runs=$((runs + 1))
  if [[ ${status[0]} != "${status[1]}" ]]; then
    echo "DIFFERS  $name: exit status ${status[0]} (old) vs ${status[1]} (new)"
    failures=$((failures + 1))
    return
  fi
  if [[ ${status[0]} != 0 ]]; then
    echo "FAILS    $name, in both: $(head -1 "$work/new.err")"
    failures=$((failures + 1))
    return
  fi
  if ! diff -rq "$work/old" "$work/new" >/dev/null; then
    echo "DIFFERS  $name: $(diff -rq "$work/old" "$work/new" | head -3 | tr '\n' ' ')"
    failures=$((failures + 1))
    return
  fi
  echo "same     $name ($(ls "$work/new" | wc -l) files)"
}

# stage PREFIX FROM=TO...: copies $data/PREFIX_FROM.npy to $work/in/TO.npy
# for each pair that exists.
stage() {
  local prefix=$1
  shift
  rm -rf "$work/in" && mkdir "$work/in"
  local pair
  for pair in "$@"; do
    local from=${pair%%=*} to=${pair#*=}
    [[ -f $data/${prefix}_$from.npy ]] && cp "$data/${prefix}_$from.npy" "$work/in/$to.npy"
  done
  return 0
}

meta() {  # meta FILE KEY: the value of "KEY" in a flat JSON file
  sed -n "s/.*\"$2\": *\([^,}]*\).*/\1/p" "$1"
}

for case in plain causal_residual masks eigenmha dropout; do
  # As the CLI's golden test: every input (not out.npy, not a gradient but
  # dout.npy, which the tool reads as do.npy).
  rm -rf "$work/in" && mkdir "$work/in"
  for file in "$data/attention/mha_${case}_"*.npy; do
    array=${file#"$data/attention/mha_${case}_"}
    case $array in
      dout.npy) cp "$file" "$work/in/do.npy" ;;
      out.npy | d*) ;;
      *) cp "$file" "$work/in/$array" ;;
    esac
  done
  file=$data/attention/mha_${case}_meta.json
  args=(mha --heads "$(meta "$file" H)")
  [[ $(meta "$file" causal) == true ]] && args+=(--causal)
  scaler=$(meta "$file" sm_scaler)
  [[ -n $scaler ]] && args+=(--scale "$scaler")
  compare "mha $case" -- "${args[@]}"
  compare "mha $case, dropout" -- "${args[@]}" --dropout 0.2 --seed 7
  compare "mha $case, unfused" -- "${args[@]}" --attention unfused
done

for prefix in $(ls $data/sinkhorn | sed -n 's/_x\.npy$//p'); do
  stage "sinkhorn/$prefix" x=x g=g
  iters=$(sed -n 's/.*_it\([0-9]*\)_.*/\1/p' <<<"$prefix")
  [[ -n $iters ]] || iters=20
  for method in implicit block unrolled; do
    compare "sinkhorn $prefix $method" -- sinkhorn --iters "$iters" --method "$method"
  done
done

for prefix in $(ls $data/ssm | sed -n 's/^\(ssd_[a-z_]*\)_meta\.json$/\1/p'); do
  stage "ssm/$prefix" x=x dt=dt a=a b=b c=c d=d init=init dy=dy dfinal=dfinal seq_idx=seq_idx \
    cu_seqlens=cu_seqlens
  chunk=$(meta "$data/ssm/${prefix}_meta.json" chunk)
  compare "ssd $prefix, one rank" mpiexec -n 1 -- ssd --chunk "${chunk:-64}"
  compare "ssd $prefix, two ranks" "${mpi[@]}" -- ssd --chunk "${chunk:-64}"
done

for prefix in $(ls $data/ssm | sed -n 's/^\(conv_[a-z0-9_]*\)_meta\.json$/\1/p'); do
  stage "ssm/$prefix" x=xbc w=conv_w bias=conv_b init=init dy=dy dfinal=dfinal
  # The conv alone: no dt heads (dt [B, L, 0], dt_bias [0]).
  python3 - "$work/in" <<'EOF'
import ast, struct, sys
d = sys.argv[1]
def header(path):
    with open(path, "rb") as f:
        f.read(8)
        n = struct.unpack("<H", f.read(2))[0]
        return ast.literal_eval(f.read(n).decode("latin1"))
def save(path, descr, shape):  # an empty array: the header only
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    text += " " * (-(10 + len(text) + 1) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1"))
x = header(d + "/xbc.npy")
save(d + "/dt.npy", x["descr"], x["shape"][:2] + (0,))
save(d + "/dt_bias.npy", x["descr"], (0,))
EOF
  args=(cp-conv)
  [[ $(meta "$data/ssm/${prefix}_meta.json" silu) == false ]] && args+=(--no-silu)
  compare "cp-conv $prefix, one rank" mpiexec -n 1 -- "${args[@]}"
  compare "cp-conv $prefix, two ranks" "${mpi[@]}" -- "${args[@]}"
done

echo "compare-cli: $runs runs, $failures differ"
[[ $failures == 0 ]]
