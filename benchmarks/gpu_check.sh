#!/usr/bin/env bash
# Everything the toolkit claims for CUDA, within a deadline, each stage with its own time limit so that a slow
# stage never costs the results of the others; every stage writes its log (and results) as it goes:
#   tests   the CUDA tests (pytest -k cuda, one line per test: a run cut off by its limit still names its results):
#           AMP, accumulation, the allocator, a real OOM, CUDA-event timing, fused groups, the measurements, a device
#           group of one process on NCCL against the one-device run, devices: 2 on one GPU (a one-line error), a
#           Hugging Face GPT-2 and timm models (when timm is installed) through `train` in bf16; at the same time,
#           on the other cores with CUDA hidden and under the same limit, the whole test suite (one line per test);
#           no timing runs meanwhile;
#   bench   the GPU systems benchmark, on a quiet machine, one stage per model (each can be named alone):
#           bench_cnn1d, bench_convnet, bench_resnet (CIFAR-10 shape) and bench_lm, the language-model example
#           (width 256, depth 4, context 256; it reads /usr/share/games/fortunes, or FORTUNES_DIR) at fp32, bf16 and
#           fp16; bench_hf, a Hugging Face GPT-2 (benchmarks/hf_models.py: 6 layers of 512, vocabulary 8192,
#           context 256, random tokens, its own loss, AdamW) at bf16; throughput up to a batch where it has levelled
#           off, the largest batch by real steps up to 2^24 (the allocator's own out-of-memory error), FLOP/s as a
#           fraction of the GPU's dense peak;
#   loop    the training loop against the tutorial DataLoader loop;
#   fused   fused runs against the same runs one after another, K = 1, 8, 64;
#   oom     a real out-of-memory in a sweep, then the accumulation plan at that batch (gpu_oom.py);
#   reproduce  the sweeps of the specs in GPU_SPECS, in order of value per minute (default: gpu_lm_small_batch_v5, the
#           beta2 test's batch 64 with 1024 updates, one fused group of 40 runs that decides a pre-registered row of
#           version 5.1; then protocol version 6's: gpu_lm_cbs_v6, the CBS with an annealed reference, 816 runs, the branches starting from
#           their seed's trunk; gpu_eoss_v6_fashion, the edge of stochastic stability on 10 000 Fashion-MNIST images
#           (a replication of the CPU test's 4000), 200 MLP runs; the predictors' large specs run on the CPU
#           since protocol 6.8; other specs: GPU_SPECS="..."),
#           2 workers, into OUT/runs, until 45 s before the deadline; a sweep cut off is stopped as Ctrl-C stops
#           it, and its runs resume from their checkpoints when the same command is run again on that folder. Its
#           report is made from OUT/runs anywhere (`bsresearch report experiments/SPEC.yaml --runs OUT/runs`).
# Results go to OUT (default benchmarks/results), logs to OUT/logs. Run from the repository root with the Python
# that has a CUDA torch and the project's packages (GIT_COMMIT names the code where the copy has no .git):
#     bash benchmarks/gpu_check.sh [OUT] [DEADLINE_SECONDS] [STAGES]
# Default: deadline 540 s, STAGES "tests bench_hf bench_lm reproduce" (in order of value per minute: CUDA code paths
# never run on a GPU before, then a benchmark never measured, then one measured on an H100 only, then as much of a
# finding as the time left allows), planned as environment 10 s, tests 170 s, bench_hf 80 s, bench_lm 90 s,
# reproduce the rest (about 190 s, 145 s of it training): one call of at most 10 minutes on a machine lent for
# about 15 minutes, its start included. The whole check on a machine of one's own:
#     bash benchmarks/gpu_check.sh benchmarks/results 3000 "tests bench loop fused oom"
# On an H100 (5724e9b) the stages took: tests 200 s (the whole suite did not finish in that), bench 185 s (without
# bench_hf), loop 60-80 s, fused 37 s, oom 100-130 s.
set -uo pipefail
OUT=${1:-benchmarks/results}
DEADLINE=$(( $(date +%s) + ${2:-540} ))
STAGES=" ${3:-tests bench_hf bench_lm reproduce} "
PY=${PYTHON:-python3}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # this tree's bsresearch, installed or not
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error  # the Hugging Face models are built from configs: no network

left() { echo $(( DEADLINE - $(date +%s) )); }
# wanted NAME...: whether STAGES names any of them (a group, "bench", or one of its stages, "bench_lm")
wanted() { local s; for s in "$@"; do [[ "$STAGES" == *" $s "* ]] && return 0; done; return 1; }
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

FORTUNES=${FORTUNES_DIR:-/usr/share/games/fortunes}
# A machine without Debian's fortunes package: the copy carried with the call (docs/gpu.md). The benches take its
# folder; the LM specs' runs read the fixed /usr/share/games/fortunes (examples/lm.py's sha256 is part of every LM
# run's id, so it is not edited to read another folder), which gets a link to the copy where it can be made.
if [[ ! -d "$FORTUNES" && -d data/fortunes ]]; then
  FORTUNES=$PWD/data/fortunes
  [[ -e /usr/share/games/fortunes ]] || { mkdir -p /usr/share/games && ln -s "$FORTUNES" /usr/share/games/fortunes; } \
    2>/dev/null || echo "note: cannot link /usr/share/games/fortunes to $FORTUNES: the LM specs' runs will not find it"
fi
{ nvidia-smi; echo "commit: $(git rev-parse HEAD 2>/dev/null || echo "${GIT_COMMIT:-unknown (no .git here)}")"
  $PY -c "import torch, sys; print(sys.version); print('torch', torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(0))"
  for m in transformers timm torchvision xdist; do
    $PY -c "import $m; print('$m', getattr($m, '__version__', 'present'))" 2>/dev/null || echo "$m: absent"; done
  [[ -d "$FORTUNES" ]] && echo "fortunes: $FORTUNES" || echo "fortunes: absent ($FORTUNES; bench_lm and the LM specs need it)"
} >"$OUT/logs/environment.log" 2>&1
cat "$OUT/logs/environment.log"

if wanted tests; then
  # the notebooks name the kernel "bsresearch", which `make install` registers; register it for $PY in a
  # folder of this run's own (JUPYTER_PATH), so a Python set up without make runs them too
  KERNELS="$(cd "$OUT/logs" && pwd)/jupyter"
  $PY -m ipykernel install --prefix "$KERNELS" --name bsresearch --display-name bsresearch >/dev/null
  export JUPYTER_PATH="$KERNELS/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
  CUDA_VISIBLE_DEVICES= stage test_suite 170 $PY -m pytest -v -rfE -n 12 --dist loadfile -p no:cacheprovider \
    --junitxml="$OUT/logs/test_suite.xml" &
  stage cuda_tests 170 $PY -m pytest -v -rsfE -k cuda -p no:cacheprovider --junitxml="$OUT/logs/cuda_tests.xml"
  wait
fi

BENCH=(--warmup 2 --repeats 3 --min-seconds 0.02 --search-limit 16777216 --quiet)
# one call per model, so that a model cut off by its limit loses only its own table
wanted bench bench_cnn1d && stage bench_cnn1d 70 $PY -m bsresearch bench --preset gpu --models cnn1d --device cuda \
  --precisions fp32,bf16,fp16 --max-batch-size 131072 "${BENCH[@]}" --out "$OUT" --stem systems_gpu_cnn1d
for m in convnet resnet; do
  wanted bench "bench_$m" && stage "bench_$m" 80 $PY -m bsresearch bench --preset gpu --models $m --device cuda \
    --precisions fp32,bf16,fp16 --max-batch-size 8192 "${BENCH[@]}" --out "$OUT" --stem "systems_gpu_$m"
done
# a Hugging Face causal LM at bf16 (random tokens: no data files)
wanted bench bench_hf && stage bench_hf 80 $PY -m bsresearch bench --device cuda \
  --model benchmarks/hf_models.py:gpt2_small --dataset benchmarks/hf_models.py:random_tokens --loss model \
  --optimizer adamw --precisions bf16 --min-batch-size 4 --max-batch-size 2048 "${BENCH[@]}" --out "$OUT" \
  --stem systems_gpu_hf_gpt2
wanted bench bench_lm && stage bench_lm 90 $PY -m bsresearch bench --device cuda --model examples/lm.py:make_model \
  --dataset examples/lm.py:make_data --optimizer adam \
  --model-kwargs '{"context": 256, "width": 256, "depth": 4, "heads": 8}' \
  --dataset-kwargs "{\"context\": 256, \"fortunes_dir\": \"$FORTUNES\"}" \
  --precisions fp32,bf16,fp16 --min-batch-size 4 --max-batch-size 4096 "${BENCH[@]}" --out "$OUT" \
  --stem systems_gpu_lm
wanted loop && stage loop_vs_dataloader 90 $PY benchmarks/loop_vs_dataloader.py --device cuda \
  --batch-sizes 32,256,4000 --seconds 0.3 --repeats 3 --out-dir "$OUT"
wanted fused && stage fused_runs 60 $PY benchmarks/fused_runs.py --device cuda --models mlp,cnn1d \
  --batch-sizes 32,256 --ks 1,8,64 --seconds 0.3 --repeats 3 --stem fused_runs_cuda --out-dir "$OUT"
wanted oom && stage gpu_oom 150 $PY benchmarks/gpu_oom.py --out "$OUT"
if wanted reproduce; then
  for spec in ${GPU_SPECS:-gpu_lm_small_batch_v5 gpu_lm_cbs_v6 gpu_eoss_v6_fashion}; do
    # Ctrl-C (SIGINT) 45 s before the deadline, so the sweep records its runs as interrupted before it is killed
    grace=$(( $(left) - 45 ))
    if (( grace < 10 )); then echo "== sweep_$spec: skipped, $(left) s left"; continue; fi
    stage "sweep_$spec" "$(left)" timeout --signal=INT --kill-after=30 "$grace" \
      $PY -m bsresearch sweep "experiments/$spec.yaml" --engine library --workers 2 --quiet --runs "$OUT/runs"
  done
fi
echo "== done, $(left) s before the deadline"
