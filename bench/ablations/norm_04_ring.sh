#!/usr/bin/env bash
# The norms' CUDA step 4 ring and partial-row sum, ablated (results/<gpu>/ablation_norm_04_ring.txt).
# On a GPU box, from the repository root:
#   git apply bench/ablations/norm_04_ring.patch
#   bash bench/ablations/norm_04_ring.sh
#   git apply -R bench/ablations/norm_04_ring.patch
# Each variant is one nvcc build of layer_norm's and rms_norm's step 4 with the patch's switches:
#   committed      as committed (rings of 4 rows, 6 on a cluster's backward)
#   clusters4      a cluster's backward ring at 4 rows (the step before)
#   rows6          single CTAs' rings up to 6 rows (a 256-thread CTA may take 200 KB)
#   two            no CTA alone on its SM (two where they fit)
#   no_sum         the partial rows left unsummed: what the sum kernel costs
#   no_pdl         the sum kernel launched without programmatic dependent launch
#   finish         the partial rows summed in the backward kernel, after a grid-wide barrier
# then timed by norm_04_ring.cu (its header says how) at the bench's bf16 shapes and a few more.
set -euo pipefail
NVCC=${NVCC:-nvcc}
OUT=${ABLATION_DIR:-.build/ablation_norm_04}
HERE=bench/ablations
mkdir -p "$OUT/gen"
python3 -c "from pathlib import Path; from rosetta import cuda_build; cuda_build.write_generated(Path('$OUT/gen'))"
FLAGS=(-O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
       -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ -I"$OUT/gen" -Icuda-kernels/common)
declare -A VARIANTS=(
  [committed]="" [clusters4]="-DABLATE_RING_CLUSTER=4"
  [rows6]="-DABLATE_RING_ROWS=6 -DABLATE_RING_BUDGET_256=(200*1024)" [two]="-DABLATE_RING_ALONE=(1<<30)"
  [no_sum]="-DABLATE_NO_SUM" [no_pdl]="-DABLATE_NO_PDL" [finish]="-DABLATE_FINISH")
for v in "${!VARIANTS[@]}"; do
  (
    read -ra extra <<< "${VARIANTS[$v]}"
    for op in layer_norm rms_norm; do
      "$NVCC" "${FLAGS[@]}" "${extra[@]}" -DROSETTA_DTYPES=__nv_bfloat16 -x cu -c "cuda-kernels/$op/04_bulk_rows.cu" \
        -o "$OUT/$v.$op.o"
    done
    "$NVCC" "${FLAGS[@]}" -c "$HERE/norm_04_ring.cu" -o "$OUT/$v.main.o"
    "$NVCC" -arch=sm_90a "$OUT/$v.main.o" "$OUT/$v.layer_norm.o" "$OUT/$v.rms_norm.o" -o "$OUT/$v"
  ) &
done
wait
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for shape in "4096 4096" "16384 8192" "4096 32768" "8192 16384"; do
  for direction in b f; do
    for v in committed clusters4 rows6 two no_sum no_pdl finish; do
      for op in ln rms; do
        [ "$direction" = f ] && [[ $v == no_* || $v == finish ]] && continue  # backward switches
        echo -n "$v "; "$OUT/$v" "$op" "$direction" $shape 40
      done
    done
  done
done
