# one call: Nsight Compute on the decode form at 16 x 4096, 2 stages (main) against 3 (FI_DTC_STAGES=3): metrics and source-level stalls
export PATH=$PATH:/usr/local/cuda/bin LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FLASHINFER_AOT=0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
make AOT=0 -j16 -s lib build/bench_decode build/bench_mixed > $OUT/build.log 2>&1 || { tail $OUT/build.log; exit 1; }
for v in st2 st3; do
  [ $v = st3 ] && export FLASHINFER_CUDA_DEFINES=-DFI_DTC_STAGES=3
  export FLASHINFER_CACHE_DIR=/tmp/fic_$v
  ./build/bench_decode --cells 16x4096 --reps 30 | grep -E "^\|? *16" | head -3
  OUT=$OUT/p_$v TAG=_$v tests/gpu/profile_decode.sh --cell 16x4096 --no-build --no-flashinfer > $OUT/prof_$v.md 2>&1
  $NCU --clock-control none --csv --page source --print-source sass --section SourceCounters --section WarpStateStats -k regex:fi_pers --launch-skip 2 --launch-count 1 ./build/bench_decode --cells 16x4096 --reps 3 > $OUT/src_$v.csv 2> $OUT/src_$v.err
  python3 tests/gpu/ncu_loops.py $OUT/src_$v.csv --top 14 > $OUT/loops_$v.txt 2>&1
  FLASHINFER_CUDA_DEFINES="${FLASHINFER_CUDA_DEFINES:-} -DFI_TRACE=65536" FLASHINFER_CACHE_DIR=/tmp/fic_tr_$v ./build/bench_mixed --mix decode-16x4096 --trace $OUT/trace_$v.csv 2>&1 | grep trace
  FLASHINFER_CUDA_DEFINES="${FLASHINFER_CUDA_DEFINES:-} -DFI_TRACE=65536" FLASHINFER_CACHE_DIR=/tmp/fic_tr_$v ./build/bench_mixed --mix decode-64x1024 --trace $OUT/trace_$v.csv 2>&1 | grep trace
done
paste -d'|' <(grep "^|" $OUT/prof_st2.md) <(grep "^|" $OUT/prof_st3.md | cut -d'|' -f3-) | grep -v "launch__\|^|---" | cut -c1-160
head -30 $OUT/loops_st2.txt; head -30 $OUT/loops_st3.txt
