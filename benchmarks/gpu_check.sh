#!/usr/bin/env bash
# Everything the toolkit claims for CUDA, within a deadline, each stage with its own time limit so that a slow
# stage never costs the results of the others:
#   tests   the CUDA tests (pytest -k cuda) and, at the same time on the other cores with CUDA hidden, the whole
#           test suite, one line per test in its log (so a suite cut off by its limit still names its failures);
#           no timing runs meanwhile;
#   bench   the GPU systems benchmark, on a quiet machine: cnn1d, convnet, resnet (CIFAR-10 shape) and the
#           language-model example (width 256, depth 4, context 256) at fp32, bf16 and fp16; throughput up to a
#           batch where it has levelled off, the largest batch by real steps up to 2^24 (the allocator's own
#           out-of-memory error), FLOP/s as a fraction of the GPU's dense peak;
#   loop    the training loop against the tutorial DataLoader loop;
#   fused   fused runs against the same runs one after another, K = 1, 8, 64;
#   oom     a real out-of-memory in a sweep, then the accumulation plan at that batch (gpu_oom.py);
#   reproduce  (not in the default stages) the sweeps of the specs in GPU_SPECS (default: gpu_keskar_fashion_convnet),
#           2 workers, into OUT/runs; a sweep cut off by its limit is stopped as Ctrl-C stops it, and its runs
#           resume from their checkpoints when the same command is run again on that folder. Its report is made
#           from OUT/runs anywhere (`bsresearch report experiments/SPEC.yaml --runs OUT/runs`), no GPU needed.
# Results go to OUT (default benchmarks/results), logs to OUT/logs. Run from the repository root with the Python
# that has a CUDA torch and the project's packages:
#     bash benchmarks/gpu_check.sh [OUT] [DEADLINE_SECONDS] [STAGES]      # STAGES default: "tests bench loop fused oom"
# On an H100 (5724e9b) the stages took: tests 200 s (the whole suite did not finish in that), bench 185 s,
# loop 60-80 s, fused 37 s, oom 100-130 s.
set -uo pipefail
OUT=${1:-benchmarks/results}
DEADLINE=$(( $(date +%s) + ${2:-3000} ))
STAGES=" ${3:-tests bench loop fused oom} "
PY=${PYTHON:-python3}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1

left() { echo $(( DEADLINE - $(date +%s) )); }
wanted() { [[ "$STAGES" == *" $1 "* ]]; }
# stage NAME SECONDS COMMAND...: at most SECONDS (and never past the deadline); its output in OUT/logs/NAME.log
stage() {
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  (( budget < limit )) && limit=$budget
  if (( limit < 10 )); then echo "== $name: skipped, $(left) s left"; return; fi
  echo "== $name (at most $limit s): $*"
  local start; start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  echo "== $name: exit $? after $(( $(date +%s) - start )) s"
  tail -n 6 "$OUT/logs/$name.log"
}

{ nvidia-smi; git rev-parse HEAD; $PY -c "import torch, sys; print(sys.version); print('torch', torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(0))"; } >"$OUT/logs/environment.log" 2>&1
cat "$OUT/logs/environment.log"

if wanted tests; then
  # the notebooks name the kernel "bsresearch", which `make install` registers; register it for $PY in a
  # folder of this run's own (JUPYTER_PATH), so a Python set up without make runs them too
  KERNELS="$(cd "$OUT/logs" && pwd)/jupyter"
  $PY -m ipykernel install --prefix "$KERNELS" --name bsresearch --display-name bsresearch >/dev/null
  export JUPYTER_PATH="$KERNELS/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
  CUDA_VISIBLE_DEVICES= stage test_suite 300 $PY -m pytest -v -rfE -n 12 --dist loadfile -p no:cacheprovider \
    --junitxml="$OUT/logs/test_suite.xml" &
  stage cuda_tests 120 $PY -m pytest -q -rs -k cuda -p no:cacheprovider --junitxml="$OUT/logs/cuda_tests.xml"
  wait
fi

BENCH=(--warmup 2 --repeats 3 --min-seconds 0.02 --search-limit 16777216 --quiet)
if wanted bench; then
  # one call per model, so that a model cut off by its limit loses only its own table
  stage bench_cnn1d 70 $PY -m bsresearch bench --preset gpu --models cnn1d --device cuda \
    --precisions fp32,bf16,fp16 --max-batch-size 131072 "${BENCH[@]}" --out "$OUT" --stem systems_gpu_cnn1d
  for m in convnet resnet; do
    stage "bench_$m" 80 $PY -m bsresearch bench --preset gpu --models $m --device cuda \
      --precisions fp32,bf16,fp16 --max-batch-size 8192 "${BENCH[@]}" --out "$OUT" --stem "systems_gpu_$m"
  done
  stage bench_lm 100 $PY -m bsresearch bench --device cuda --model examples/lm.py:make_model \
    --dataset examples/lm.py:make_data --optimizer adam \
    --model-kwargs '{"context": 256, "width": 256, "depth": 4, "heads": 8}' --dataset-kwargs '{"context": 256}' \
    --precisions fp32,bf16,fp16 --min-batch-size 4 --max-batch-size 4096 "${BENCH[@]}" --out "$OUT" \
    --stem systems_gpu_lm
fi
wanted loop && stage loop_vs_dataloader 90 $PY benchmarks/loop_vs_dataloader.py --device cuda \
  --batch-sizes 32,256,4000 --seconds 0.3 --repeats 3 --out-dir "$OUT"
wanted fused && stage fused_runs 60 $PY benchmarks/fused_runs.py --device cuda --models mlp,cnn1d \
  --batch-sizes 32,256 --ks 1,8,64 --seconds 0.3 --repeats 3 --stem fused_runs_cuda --out-dir "$OUT"
wanted oom && stage gpu_oom 150 $PY benchmarks/gpu_oom.py --out "$OUT"
if wanted reproduce; then
  for spec in ${GPU_SPECS:-gpu_keskar_fashion_convnet}; do
    # Ctrl-C (SIGINT) 45 s before the deadline, so the sweep records its runs as interrupted before it is killed
    grace=$(( $(left) - 45 ))
    if (( grace < 10 )); then echo "== sweep_$spec: skipped, $(left) s left"; continue; fi
    stage "sweep_$spec" "$(left)" timeout --signal=INT --kill-after=30 "$grace" \
      $PY -m bsresearch sweep "experiments/$spec.yaml" --engine library --workers 2 --quiet --runs "$OUT/runs"
  done
fi
echo "== done, $(left) s before the deadline"
