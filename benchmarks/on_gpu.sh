#!/usr/bin/env bash
# One GPU session's checks and benchmarks, most needed first, each under its own time limit, so that
# a short lease still brings back the first ones. Run from the repository root on a machine with
# CUDA, torch, sympy, jinja2, click and PyYAML (no symgrad install needed: the repository is put on
# the path, its templates and docs linked in as symgrad.templates and symgrad.docs, which an
# install would map). Writes into ${OUT:-out/gpu}:
#   device_check.log  the committed generated modules on the GPU against autograd (benchmarks/device_check.py)
#   bind_zoo.log      every zoo network bound on the GPU: float64 grads, bfloat16 and float16 autocast
#   cuda_graph.log    the bound step captured and replayed as CUDA graphs against autograd (tests/test_cuda_graph.py)
#   training.log, training-cuda.json, BENCHMARKS-training.md   python -m benchmarks.training --device cuda
#   seeds-CASE.log, .json, .md   python -m benchmarks --device cuda --cases CASE, for seeds 2, 3 and 1
# With WORK set they are written there and packed into $OUT/results.tgz after each step (a lease
# brings back a few files, and a step cut short keeps the ones before it).
# DEVICE=cpu QUICK=1 runs the same steps on a CPU with tiny sizes: a smoke test of this script.
set -u
out=${WORK:-${OUT:-out/gpu}}  # WORK: where the files go; then packed into $OUT/results.tgz after each step
device=${DEVICE:-cuda}
quick=${QUICK:+--quick}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
for name in templates docs; do  # linked for this run alone, removed on the way out
    [ -e "symgrad/$name" ] || { ln -s "../$name" "symgrad/$name" && trap 'rm -f symgrad/templates symgrad/docs' EXIT; }
done
$python -c "import torch, symgrad.trace; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
seconds() { echo "${LIMIT_SCALE:-1}" "$1" | awk '{print int($1 * $2)}'; }

keep() { [ -n "${OUT:-}" ] && [ "$out" != "$OUT" ] && tar czf "$OUT/results.tgz" -C "$out" . ; }

if [ "${CHECK:-1}" = 1 ]; then  # CHECK=0 skips it (already run in this session)
    timeout "$(seconds 40)" $python -m benchmarks.device_check "$device" >"$out/device_check.log" 2>&1
    echo "device_check: exit $? ($(grep -c ' ok$' "$out/device_check.log") ok, $(grep -c FAIL "$out/device_check.log") FAIL)"; keep
fi

SYMGRAD_TEST_DEVICE=$device timeout "$(seconds 90)" $python -m pytest -q -p no:cacheprovider -n 8 \
    tests/test_bind_zoo.py ${QUICK:+-k resnet} >"$out/bind_zoo.log" 2>&1
echo "bind_zoo: exit $? $(tail -n 1 "$out/bind_zoo.log")"; keep

SYMGRAD_TEST_DEVICE=$device timeout "$(seconds 60)" $python -m pytest -q -p no:cacheprovider -n 0 \
    tests/test_cuda_graph.py >"$out/cuda_graph.log" 2>&1  # bind(..., cuda_graph=True) against autograd, several steps
echo "cuda_graph: exit $? $(tail -n 1 "$out/cuda_graph.log")"; keep

# the training rows include "symgrad.bind, CUDA graph" and "autograd, torch.compile reduce-overhead" on CUDA
timeout "$(seconds 230)" $python -m benchmarks.training --device "$device" $quick --json "$out/training-$device.json" \
    --output "$out/BENCHMARKS-training.md" >"$out/training.log" 2>&1
echo "training: exit $?"; tail -n 3 "$out/training.log"; keep

for case in seed2-full seed3-full seed1-full; do  # one call each: a case cut short loses itself alone
    timeout "$(seconds 65)" $python -m benchmarks --device "$device" $quick --cases "$case" \
        --output "$out/seeds-$case.md" --plot '' >"$out/seeds-$case.log" 2>&1
    echo "$case: exit $?"; keep
done
