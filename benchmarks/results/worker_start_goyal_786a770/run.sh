#!/bin/bash
cd /work/main
for arm in fresh forked; do
  rm -rf /tmp/ab/$arm
  if [ $arm = fresh ]; then export BSRESEARCH_FORK_WORKERS=0; else unset BSRESEARCH_FORK_WORKERS; fi
  s=$(date +%s.%N)
  .venv/bin/bsresearch sweep experiments/goyal.yaml --engine library --quiet --runs /tmp/ab/$arm > /tmp/ab/$arm.log 2>&1
  e=$(date +%s.%N)
  echo "$arm wall $(echo "$e - $s" | bc) s" >> /tmp/ab/times.txt
done
