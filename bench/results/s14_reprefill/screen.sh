#!/bin/bash
# usage: screen.sh OUTDIR POLICIES PARAMS ; seeds 0-5, loads 0.015 0.02, noisy; 2 at a time
cd /tmp/s14-reprefill/tree
export PYTHONPATH=/tmp/s14-reprefill/tree/src FLEETGATE_TRACES_DIR=/work/shared/traces
OUT=$1; POL=$2; PAR=$3
mkdir -p $OUT
jobs_list=()
for S in 0 1 2 3 4 5; do for L in 0.015 0.02; do jobs_list+=("$S:$L"); done; done
run() { S=${1%:*}; L=${1#*:}
  echo "start $S $L $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/log.txt
  nice -n 19 /work/main/.venv/bin/python bench/session_affinity.py --workload agentic --load $L --replicas 16,32 --seed $S \
    --speed-noise 0.3 --policies "$POL" --params "$PAR" --bar > $OUT/s${S}_x$L.txt 2>&1
  echo "end $S $L rc=$? $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/log.txt
}
i=0
for j in "${jobs_list[@]}"; do
  run $j &
  i=$((i+1))
  if (( i % 2 == 0 )); then wait; fi
done
wait
echo done >> $OUT/log.txt
