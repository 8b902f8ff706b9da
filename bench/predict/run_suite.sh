#!/usr/bin/env bash
# bench/predict: accuracy of `cachet predict` against the GPU (docs/predict.md section 6). On the GPU
# machine, from the repository root, with .deps from scripts/fetch-gpu-deps:
#
#   bench/predict/run_suite.sh OUTDIR [PROGRAM...]
#   PROGRAMS_DIR=bench/predict/heldout bench/predict/run_suite.sh OUTDIR PROGRAM...   (the held-out set)
#
# Builds cachet and the fake device, runs each suite program natively twice (memory history on),
# then natively twice at caps of 0.95, 0.85 and 0.70 of its first run's peak reserved, and through
# `cachet predict` with no GPU visible (CUDA_VISIBLE_DEVICES=) at the same caps, then writes
# OUTDIR/suite.json and the table of bench/predict/report.py.
set -uo pipefail
out=$(realpath -m "${1:?OUTDIR}"); shift
mkdir -p "$out"
progs=("$@")
[ ${#progs[@]} -eq 0 ] && progs=(gpt2_train_bf16 t5_train_fp16_scaler resnet50_train vit_timm_checkpointing
  bert_accumulation llama_generate side_stream_mlp convnext_timm_bf16)
P=${PROGRAMS_DIR:-bench/predict/programs}
export PYTHONUNBUFFERED=1
deps=/tmp/deps; mkdir -p $deps; for f in .deps/*.deb; do dpkg -x "$f" $deps; done
cmake -S . -B build/predict -G Ninja -DCMAKE_BUILD_TYPE=Release -DCACHET_CUDA=ON -DCACHET_BUILD_TESTS=OFF \
  -DCACHET_BUILD_BENCH=OFF -DCACHET_MUTANTS=OFF \
  -DCMAKE_PREFIX_PATH="$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share/cmake" > "$out/configure.log" 2>&1 \
  || { tail -20 "$out/configure.log"; exit 1; }
cmake --build build/predict -j "$(nproc)" --target cachet cachet_fakecuda cachet_fakecudnn > "$out/build.log" 2>&1 \
  || { grep -m5 -A5 error "$out/build.log"; exit 1; }
C=$PWD/build/predict/tools/cachet
echo "== built"
# Native truth: two runs each, four programs at a time (each process has its own allocator).
for p in "${progs[@]}"; do
  for r in 1 2; do
    ( python3 bench/predict/record_native.py --out "$out/$p.native$r" -- $P/$p.py > "$out/$p.native$r.log" 2>&1 ) &
    while [ "$(jobs -rp | wc -l)" -ge ${PAR:-6} ]; do sleep 0.5; done
  done
done
wait
echo "== native done"
total=$(python3 -c 'import torch;print(torch.cuda.mem_get_info()[1])')
for p in "${progs[@]}"; do
  peak=$(python3 -c "import json;print(json.load(open('$out/$p.native1.json'))['peak_reserved'])" 2>/dev/null) || continue
  caps=""
  for f in 0.95 0.85 0.70; do
    cap=$(python3 -c "print(int($peak*$f))")
    caps="$caps --cap $cap"
    for r in 1 2; do
      ( python3 bench/predict/record_native.py --fraction "$(python3 -c "print($cap/$total)")" --out "$out/$p.cap$f.r$r" \
          -- $P/$p.py > "$out/$p.cap$f.r$r.log" 2>&1; rm -f "$out/$p.cap$f.r$r.pickle" ) &
      while [ "$(jobs -rp | wc -l)" -ge ${PAR:-6} ]; do sleep 0.5; done
    done
  done
  echo "$caps" > "$out/$p.caps"
done
# Predictions, one at a time (their wall time is reported), while the capped native runs finish.
for p in "${progs[@]}"; do
  [ -f "$out/$p.caps" ] || continue
  /usr/bin/time -f "%e" -o "$out/$p.pred.time" env CUDA_VISIBLE_DEVICES= $C predict --gpu H200 --json $(cat "$out/$p.caps") \
    --dump-snapshot "$out/$p.pred.pickle" -- $P/$p.py > "$out/$p.pred.json" 2> "$out/$p.pred.log"
  echo "predict $p rc $? $(cat "$out/$p.pred.time") s"
done
wait
# Replay speed: one predicted snapshot under 10 configurations, parsing included.
confs=(--conf '' --conf 'expandable_segments:True' --conf 'max_split_size_mb:128' --conf 'max_split_size_mb:512'
  --conf 'roundup_power2_divisions:4' --conf 'roundup_power2_divisions:8' --conf 'garbage_collection_threshold:0.8'
  --conf 'expandable_segments:True,roundup_power2_divisions:4' --conf 'large_segment_size_mb:64' --conf 'policy:cachet')
/usr/bin/time -f "%e" -o "$out/replay10.time" $C replay "$out/${progs[0]}.pred.pickle" "${confs[@]}" > "$out/replay10.txt" 2>&1
echo "replay of ${progs[0]} under 10 configurations: $(cat "$out/replay10.time") s"
python3 bench/predict/report.py "$out" "${progs[@]}" | tee "$out/report.md"
