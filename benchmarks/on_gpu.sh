#!/usr/bin/env bash
# One GPU session's checks and benchmarks, most needed first, each under its own time limit, so that
# a short lease still brings back the first ones. Run from the repository root on a machine with
# CUDA, torch, sympy, jinja2, click and PyYAML (no symgrad install needed: the repository is put on
# the path, its templates and docs linked in as symgrad.templates and symgrad.docs, which an
# install would map). Writes into ${OUT:-out/gpu}:
#   device_check.log  the committed generated modules on the GPU against autograd (benchmarks/device_check.py)
#   bind_zoo.log      every zoo network bound on the GPU: float64 grads, bfloat16 and float16 autocast
#   cuda_graph.log    the bound step captured and replayed as CUDA graphs against autograd (tests/bind/test_cuda_graph.py)
#   training*.log, training-cuda*.json   python -m benchmarks.training --device cuda, in three runs:
#                     every row eagerly and as CUDA graphs; the around-the-kernels table; ResNet-18 at
#                     32 x 224² with torch.compile (default, reduce-overhead) and the compiled bound model
#   BENCHMARKS-training.md   the three merged (--rows)
#   seeds-CASE.log, .json, .md   python -m benchmarks --device cuda --cases CASE (SEEDS=1 only: a lease of
#                     15 minutes, the machine's start included, holds the steps above alone)
# With WORK set they are written there and packed into $OUT/results.tgz after each step (a lease
# brings back a few files, and a step cut short keeps the ones before it).
# GRAPHS, CHECK, EAGER, OVERHEAD, COMPILED, ZOO (each 1 by default) =0 skip a step; EAGER_ARGS="--networks N.."
# is added to the eager run. DEVICE=cpu QUICK=1 runs the same steps on a CPU with tiny sizes: a smoke test of this script.
set -u
out=${WORK:-${OUT:-out/gpu}}  # WORK: where the files go; then packed into $OUT/results.tgz after each step
device=${DEVICE:-cuda}
quick=${QUICK:+--quick}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1  # carried wheels kept on the path
python=${PYTHON:-python3}
for name in templates docs; do  # linked for this run alone, removed on the way out
    [ -e "symgrad/$name" ] || { ln -s "../$name" "symgrad/$name" && trap 'rm -f symgrad/templates symgrad/docs' EXIT; }
done
$python -c "import torch, symgrad.trace; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
seconds() { echo "${LIMIT_SCALE:-1}" "$1" | awk '{print int($1 * $2)}'; }

keep() { [ -n "${OUT:-}" ] && [ "$out" != "$OUT" ] && tar czf "$OUT/results.tgz" -C "$out" . ; }

cuda_graph_check() {
    SYMGRAD_TEST_DEVICE=$device timeout "$(seconds 90)" $python -m pytest -q -p no:cacheprovider -n 0 \
        tests/bind/test_cuda_graph.py >"$out/cuda_graph.log" 2>&1  # bind(..., cuda_graph=True) against autograd
    echo "cuda_graph: exit $? $(tail -n 1 "$out/cuda_graph.log")"; keep
}
[ "${GRAPHS:-1}" = 1 ] && cuda_graph_check

if [ "${CHECK:-1}" = 1 ]; then  # CHECK=0 skips it (already run in this session)
    timeout "$(seconds 35)" $python -m benchmarks.device_check "$device" >"$out/device_check.log" 2>&1
    echo "device_check: exit $? ($(grep -c ' ok$' "$out/device_check.log") ok, $(grep -c FAIL "$out/device_check.log") FAIL)"; keep
fi

training() {  # NAME LIMIT ARGUMENTS...: one run of benchmarks.training, its rows saved as they come
    local name=$1 limit=$2; shift 2
    timeout "$(seconds "$limit")" $python -m benchmarks.training --device "$device" $quick --json "$out/$name.json" \
        --output "$out/BENCHMARKS-$name.md" "$@" >"$out/$name.log" 2>&1
    echo "$name: exit $?"; tail -n 2 "$out/$name.log"; keep
}
eager=(--variants "symgrad.bind" "symgrad.bind, channels_last" "autograd" "autograd, channels_last"
       "symgrad.bind, AMP" "symgrad.bind, channels_last, AMP" "autograd, AMP" "autograd, channels_last, AMP"
       "symgrad.bind, CUDA graph" "symgrad.bind, channels_last, CUDA graph"
       "symgrad.bind, CUDA graph, AMP" "symgrad.bind, channels_last, CUDA graph, AMP")
[ "${EAGER:-1}" = 1 ] && training training-cuda 190 "${eager[@]}" --skip-overhead ${EAGER_ARGS:-}
[ "${OVERHEAD:-1}" = 1 ] && training training-cuda-overhead 80 "${eager[@]}" --overhead-only
[ "${COMPILED:-1}" = 1 ] && training training-cuda-compiled 140 --limit 1 --tag "compiled run" --skip-overhead --variants \
    "autograd" "autograd, channels_last" "symgrad.bind, CUDA graph" "symgrad.bind, channels_last, CUDA graph" \
    "autograd, torch.compile" "symgrad.bind, torch.compile" "autograd, torch.compile reduce-overhead" \
    "autograd, channels_last, torch.compile reduce-overhead"
runs=(); for name in training-cuda training-cuda-overhead training-cuda-compiled; do
    [ -s "$out/$name.json" ] && runs+=("$out/$name.json"); done
[ ${#runs[@]} -gt 0 ] && $python -m benchmarks.training --rows "${runs[@]}" --output "$out/BENCHMARKS-training.md" \
    --plot "$out/training-cuda.png" >"$out/merge.log" 2>&1; keep

if [ "${ZOO:-1}" = 1 ]; then  # -v: each test named as it ends, so a run cut short says which failed
    SYMGRAD_TEST_DEVICE=$device timeout "$(seconds 100)" $python -m pytest -v -rf -p no:cacheprovider -n 16 \
        tests/models/test_bind_zoo.py ${QUICK:+-k resnet} >"$out/bind_zoo.log" 2>&1
    echo "bind_zoo: exit $? $(tail -n 1 "$out/bind_zoo.log")"; grep -E "(FAILED|ERROR) " "$out/bind_zoo.log"; keep
fi

if [ "${SEEDS:-0}" = 1 ]; then
    for case in seed2-full seed3-full seed1-full; do  # one call each: a case cut short loses itself alone
        timeout "$(seconds 65)" $python -m benchmarks --device "$device" $quick --cases "$case" \
            --output "$out/seeds-$case.md" --plot '' >"$out/seeds-$case.log" 2>&1
        echo "$case: exit $?"; keep
    done
fi
