#!/usr/bin/env bash
# The CUDA checks of this device bundle (built by `cargo xtask device-bundle`,
# see docs/gpu.md). Usage:
#   ./run.sh [--data-dir DIR] [--epochs N] [--budget SECS] [--only REGEX] [--logs DIR]
#            [--archive FILE]
#
# Needs the NVIDIA driver, and NVRTC from a CUDA toolkit or a pip wheel (a
# PyTorch venv has one: run with that python on PATH or PYTHON=.../python);
# with a PyTorch that sees the GPU it also times PyTorch on the same model.
# Each step gets at most 600 s and all steps together --budget seconds
# (default 900): a step is stopped when the budget runs out, and skipped
# when less than 30 s of it is left.
# --only runs just the steps whose names match the (bash) regex.
# --archive also packs the logs into one .tar.gz at the end (a device session
# brings back only a few files).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data_dir="$here/data/fashion-mnist"
epochs=5
budget=900
only=
logs="$here/logs"
archive=
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) data_dir=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --archive) archive=$2; shift 2 ;;
    *) echo "usage: $0 [--data-dir DIR] [--epochs N] [--budget SECS] [--only REGEX] [--logs DIR] [--archive FILE]" >&2; exit 2 ;;
  esac
done
deadline=$((SECONDS + budget))
links="$here/lib"
mkdir -p "$logs" "$links"
python=${PYTHON:-python3}
# PyTorch runs with the caller's library path: it brings its own NCCL and NVRTC.
orig_ld=${LD_LIBRARY_PATH-}
summary=()
failed=0
row() { summary+=("$(printf '%-22s %-7s %s' "$1" "$2" "$3")"); [ "$2" = FAIL ] && failed=1; }
# Whether --only selects step $1.
selected() { [ -z "$only" ] || [[ $1 =~ $only ]]; }
# A row for step $1 that cannot run here, for reason $2.
skip() { if selected "$1"; then row "$1" skipped "$2"; fi; }

# The first file matching the glob $1 under the site-packages of $python.
in_wheels() {
  "$python" - "$1" 2>/dev/null <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    hits = sorted(glob.glob(os.path.join(root, "nvidia", "**", sys.argv[1]), recursive=True))
    hits += sorted(glob.glob(os.path.join(root, "triton", "**", sys.argv[1]), recursive=True))
    if hits:
        print(hits[0])
        break
PY
}
# The first library named $1* that the system loader knows or a CUDA install has.
in_system() {
  {
    ldconfig -p 2>/dev/null | awk -v name="$1" 'index($1, name) == 1 { print $NF }'
    for dir in ${CUDA_HOME:-} /usr/local/cuda; do ls "$dir/lib64/$1"* 2>/dev/null; done
  } | head -n 1
}
# Links $links/$1 to the first existing candidate and puts both folders on
# LD_LIBRARY_PATH; the target is left in $linked.
link() {
  local name=$1; shift
  for target in "$@"; do
    if [ -n "$target" ] && [ -e "$target" ]; then
      ln -sf "$target" "$links/$name"
      LD_LIBRARY_PATH="$links:$(dirname "$target")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      export LD_LIBRARY_PATH
      linked=$target
      return 0
    fi
  done
  return 1
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
if [ -n "$gpu" ]; then row gpu ok "$gpu"; else row gpu FAIL "nvidia-smi found no GPU"; fi
# The GPU's architecture, for the NVRTC check (e.g. 90 for sm_90).
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
[ -n "$cap" ] && export CUDA_COMPUTE_CAP=$cap

# cudarc asks the loader for libnvrtc.so (then .so.12, ...) and libnccl.so;
# wheels ship only versioned names, hence the links.
if link libnvrtc.so "$(in_system libnvrtc.so)" "$(in_wheels 'libnvrtc.so.[0-9]*')"; then
  row libnvrtc ok "$linked"
else
  row libnvrtc FAIL "not found: install a CUDA toolkit or pip install nvidia-cuda-nvrtc-cu12"
fi
have_nccl=0
if link libnccl.so "$(in_system libnccl.so)" "$(in_wheels 'libnccl.so.2')"; then
  row libnccl ok "$linked"
  have_nccl=1
else
  row libnccl missing "the NCCL steps need it (pip install nvidia-nccl-cu13)"
fi
ptxas=$(command -v ptxas || in_wheels ptxas)
[ -n "$ptxas" ] && export PTXAS=$ptxas

# Runs "$@" (if --only selects $name and the budget allows) with its output
# in $logs/$name.log; a row with the last line matching $pattern (else the
# last line), blanks squeezed.
step() {
  local name=$1 pattern=$2; shift 2
  selected "$name" || return 0
  local start=$SECONDS limit=$((deadline - SECONDS))
  if [ "$limit" -lt 30 ]; then
    row "$name" skipped "out of time (--budget $budget)"
    return 0
  fi
  [ "$limit" -gt 600 ] && limit=600
  echo "== $name: $*"
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
  local status=${PIPESTATUS[0]}
  local detail
  detail=$(grep -E "$pattern" "$logs/$name.log" | tail -n 1)
  [ -n "$detail" ] || detail=$(grep -v '^[[:space:]]*$' "$logs/$name.log" | tail -n 1)
  [ -n "$detail" ] || detail="no output"
  detail="$(printf '%s\n' "$detail" | tr -s '[:blank:]' ' ' | sed 's/^ //' | cut -c1-100) ($((SECONDS - start)) s)"
  case $status in
    0) row "$name" ok "$detail" ;;
    124 | 137) row "$name" FAIL "timed out after $limit s: $detail" ;;
    *) row "$name" FAIL "exit $status: $detail" ;;
  esac
}
# The nccl-tests table row of the largest size.
largest='^ *[0-9]+ +[0-9]+ +float '

step nvrtc_compile 'test result|skipped' "$here/tests/nvrtc_compile" --nocapture
step cuda_parity 'test result' env REQUIRE_GPU=1 "$here/tests/cuda_parity"
# NCCL at world size 1, a peer that never joins, page-locked staging, and
# `--backend auto` with two ranks on one GPU (the trainer from this bundle).
if [ "$have_nccl" = 1 ]; then
  step nccl_gpu 'test result' env REQUIRE_GPU=1 REQUIRE_NCCL=1 TRAINER_BIN="$here/bin/trainer" \
    "$here/tests/nccl_gpu" --test-threads 1
else
  step nccl_gpu 'test result' env REQUIRE_GPU=1 TRAINER_BIN="$here/bin/trainer" \
    "$here/tests/nccl_gpu" --test-threads 1
fi

# Training: one GPU over no transport, over NCCL, two ranks sharing it over
# the TCP ring, and large batches.
trainer=("$here/bin/trainer" --device cuda --data-dir "$data_dir")
step train 'Epoch' "${trainer[@]}" --epochs "$epochs" --metrics "$logs/metrics.jsonl"
if [ "$have_nccl" = 1 ]; then
  step train_nccl 'Epoch' "${trainer[@]}" --backend nccl --epochs "$epochs" \
    --metrics "$logs/train_nccl.jsonl"
else
  skip train_nccl "no libnccl"
fi
step train_tcp_ws2 'Epoch' "${trainer[@]}" --world-size 2 --backend tcp --epochs "$epochs" \
  --metrics "$logs/train_tcp_ws2.jsonl"
for batch in 256 512; do
  step "train_b$batch" 'Epoch' "${trainer[@]}" --batch-size "$batch" --epochs 1 \
    --metrics "$logs/train_b$batch.jsonl"
done
# The same on the tensor cores (--tf32): accuracy over the full run, speed
# at each batch size.
step train_tf32 'Epoch' "${trainer[@]}" --tf32 --epochs "$epochs" \
  --metrics "$logs/train_tf32.jsonl"
for batch in 256 512; do
  step "train_tf32_b$batch" 'Epoch' "${trainer[@]}" --tf32 --batch-size "$batch" --epochs 1 \
    --metrics "$logs/train_tf32_b$batch.jsonl"
done
# Mixed precision (--bf16: bf16 products, float32 sums and weights), as
# above: accuracy over the full run (goal 0.91), speed at each batch size.
step train_bf16 'Epoch' "${trainer[@]}" --bf16 --epochs "$epochs" \
  --metrics "$logs/train_bf16.jsonl"
for batch in 256 512; do
  step "train_bf16_b$batch" 'Epoch' "${trainer[@]}" --bf16 --batch-size "$batch" --epochs 1 \
    --metrics "$logs/train_bf16_b$batch.jsonl"
done
# The products in the wide tiles (64 x 256; the same bits), float32 and
# TF32, one epoch each.
for batch in 64 512; do
  step "train_wide_b$batch" 'Epoch' "${trainer[@]}" --fp32-tile wide --batch-size "$batch" \
    --epochs 1 --metrics "$logs/train_wide_b$batch.jsonl"
  step "train_wide_tf32_b$batch" 'Epoch' "${trainer[@]}" --tf32 --fp32-tile wide \
    --batch-size "$batch" --epochs 1 --metrics "$logs/train_wide_tf32_b$batch.jsonl"
done
# The tiles staged by cp.async (--gemm-staging cp-async; the same bits),
# float32 and TF32, one epoch each, beside train, train_b512, train_tf32
# and train_tf32_b512.
for batch in 64 512; do
  step "train_cp_async_b$batch" 'Epoch' "${trainer[@]}" --gemm-staging cp-async \
    --batch-size "$batch" --epochs 1 --metrics "$logs/train_cp_async_b$batch.jsonl"
  step "train_cp_async_tf32_b$batch" 'Epoch' "${trainer[@]}" --tf32 --gemm-staging cp-async \
    --batch-size "$batch" --epochs 1 --metrics "$logs/train_cp_async_tf32_b$batch.jsonl"
done
# The fused ops as their separate kernels (--no-fusion; the same bits):
# conv1 + ReLU, conv2 + max-pool + ReLU + dropout, fc1 + ReLU + dropout,
# beside `train` and `train_b512`, which fuse them.
for batch in 64 512; do
  step "train_unfused_b$batch" 'Epoch' "${trainer[@]}" --no-fusion --batch-size "$batch" \
    --epochs 1 --metrics "$logs/train_unfused_b$batch.jsonl"
done

# PyTorch on the same model and data, and its all-reduce.
if [ -n "$orig_ld" ]; then
  torch_env=(env PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="$orig_ld")
else
  torch_env=(env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1)
fi
have_torch=0
if "${torch_env[@]}" "$python" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  have_torch=1
  throughput=("${torch_env[@]}" "$python" "$here/pytorch/train_throughput.py" --device cuda
    --data-dir "$data_dir")
  for batch in 64 256 512; do
    step "torch_ref_b$batch" 'img/s' "${throughput[@]}" --mode reference --batch-size "$batch"
    step "torch_gpu_b$batch" 'img/s' "${throughput[@]}" --mode on-device --batch-size "$batch"
    step "torch_gpu_tf32_b$batch" 'img/s' "${throughput[@]}" --mode on-device --tf32 \
      --batch-size "$batch"
    # PyTorch's AMP: torch.autocast to bf16, beside train_bf16*.
    step "torch_gpu_bf16_b$batch" 'img/s' "${throughput[@]}" --mode on-device --bf16 \
      --batch-size "$batch"
  done
  step torch_allreduce "$largest" "${torch_env[@]}" "$python" "$here/pytorch/allreduce_nccl.py" \
    --min-bytes 8 --max-bytes 268435456
else
  for name in torch_ref_b{64,256,512} torch_gpu_b{64,256,512} torch_gpu_tf32_b{64,256,512} \
    torch_gpu_bf16_b{64,256,512} torch_allreduce; do
    if selected "$name"; then
      row torch skipped "no torch that sees a GPU in $python (set PYTHON=.../python)"
      break
    fi
  done
fi

# The benches (train_step is the CPU backend, one thread; cnn_layers times
# each layer's kernels on the GPU with CUDA events).
step bench_train_step '.' "$here/benches/train_step"
for batch in 64 512; do
  step "bench_cnn_layers_b$batch" '^ +sum' "$here/benches/cnn_layers" --device cuda \
    --batch-size "$batch" --reps 50
  step "bench_cnn_layers_tf32_b$batch" '^ +sum' "$here/benches/cnn_layers" --device cuda \
    --tf32 --batch-size "$batch" --reps 50
  step "bench_cnn_layers_bf16_b$batch" '^ +sum' "$here/benches/cnn_layers" --device cuda \
    --bf16 --batch-size "$batch" --reps 50
  # The products in the wide tiles (the same bits), beside float32 and TF32.
  step "bench_cnn_layers_wide_b$batch" '^ +sum' "$here/benches/cnn_layers" --device cuda \
    --fp32-tile wide --batch-size "$batch" --reps 50
  step "bench_cnn_layers_wide_tf32_b$batch" '^ +sum' "$here/benches/cnn_layers" --device cuda \
    --tf32 --fp32-tile wide --batch-size "$batch" --reps 50
  # The fused ops as separate kernels, beside the fused `conv1+relu`,
  # `conv2+pool` and `fc1+relu` rows.
  step "bench_cnn_layers_unfused_b$batch" '^ +sum' "$here/benches/cnn_layers" --device cuda \
    --no-fusion --batch-size "$batch" --reps 50
done
step bench_allreduce_unix "$largest" "$here/benches/allreduce" --ranks 2 --max-bytes 67108864
if [ "$have_nccl" = 1 ]; then
  step bench_allreduce_nccl "$largest" "$here/benches/allreduce" --transport nccl --ranks 1
else
  skip bench_allreduce_nccl "no libnccl"
fi

# Per-kernel device times of 100 launches in the middle of training (Nsight
# Compute, one metric, so each kernel runs once).
if command -v ncu >/dev/null; then
  step ncu_kernels '==PROF==|gpu__time_duration' ncu --metrics gpu__time_duration.sum --csv \
    --launch-skip 400 --launch-count 100 "${trainer[@]}" --epochs 1 --max-steps 40
  step ncu_kernels_tf32 '==PROF==|gpu__time_duration' ncu --metrics gpu__time_duration.sum \
    --csv --launch-skip 400 --launch-count 100 "${trainer[@]}" --tf32 --epochs 1 --max-steps 40
else
  skip ncu_kernels "no ncu on PATH"
fi

# The trainer of `cargo xtask device-bundle --baseline REV`, timed as above,
# so that one session compares the two builds on the same GPU.
if [ -x "$here/baseline/bin/trainer" ]; then
  base=("$here/baseline/bin/trainer" --device cuda --data-dir "$data_dir")
  for batch in 64 512; do
    step "base_train_b$batch" 'Epoch' "${base[@]}" --batch-size "$batch" --epochs 1 \
      --metrics "$logs/base_train_b$batch.jsonl"
  done
  if command -v ncu >/dev/null; then
    step base_ncu_kernels '==PROF==|gpu__time_duration' ncu --metrics gpu__time_duration.sum \
      --csv --launch-skip 400 --launch-count 100 "${base[@]}" --epochs 1 --max-steps 40
  fi
fi

# Why the GEMM kernels take what they take: throughput against peak, the
# warps' stall reasons, shared-memory bank conflicts; one launch of each.
if command -v ncu >/dev/null; then
  # The wide tiles' kernels (`_f32w`, float32 or TF32) at batch 512,
  # where conv2's products take them.
  # The cp.async staging's kernels keep their names (`_f32`, `_tf32`).
  for variant in f32 tf32 bf16 wide wide_tf32 cp_async cp_async_tf32; do
    flags=()
    suffix=$variant
    case $variant in
      tf32) flags=(--tf32) ;;
      bf16) flags=(--bf16) ;;
      wide) flags=(--fp32-tile wide --batch-size 512); suffix=f32w ;;
      wide_tf32) flags=(--tf32 --fp32-tile wide --batch-size 512); suffix=f32w ;;
      cp_async) flags=(--gemm-staging cp-async); suffix=f32 ;;
      cp_async_tf32) flags=(--tf32 --gemm-staging cp-async); suffix=tf32 ;;
    esac
    # The convs' forward products are conv2d_relu_fwd and conv2d_pool_fwd
    # (fused with their ReLU and pool), fc1's linear_relu_fwd when unsplit
    # (split, linear_fwd_partial, then linear_relu_fwd_reduce_f32 stores).
    gemms="regex:^(conv2d|conv2d_pool|conv2d_relu|linear|linear_relu)_(fwd|bwd_input|bwd_weight)(_partial)?_$suffix\$"
    step "ncu_detail_$variant" '==PROF==|Duration' ncu --section SpeedOfLight \
      --section WarpStateStats --section MemoryWorkloadAnalysis_Tables --csv \
      --kernel-name "$gemms" --launch-skip 24 --launch-count 12 \
      "${trainer[@]}" "${flags[@]}" --epochs 1 --max-steps 10
  done
  # The same for the bias gradients' two passes, both conv layers of one
  # step (they were 23 % of the float32 step on 2026-11-27 in one pass).
  step ncu_detail_bias '==PROF==|Duration' ncu --section SpeedOfLight \
    --section WarpStateStats --section MemoryWorkloadAnalysis_Tables --csv \
    --kernel-name "regex:^conv2d_bwd_bias_" --launch-skip 8 --launch-count 4 \
    "${trainer[@]}" --epochs 1 --max-steps 10
fi

# Last, as the GPU steps come first: the CPU-speed goals on this host's CPU
# (its model and ISA head the table).
if [ "$have_torch" = 1 ]; then
  step cpu_side_by_side '^\| 1 rank x 1 thread' "${torch_env[@]}" "$python" \
    "$here/pytorch/side_by_side.py" --rounds 3 --steps 50 --trainer "$here/bin/trainer" \
    --train-step "$here/benches/train_step" --data-dir "$data_dir"
else
  skip cpu_side_by_side "no torch that sees a GPU in $python"
fi

echo
echo "== summary ($(head -n 1 "$here/build-info.txt"); logs in $logs)"
{
  printf '%-22s %-7s %s\n' step result detail
  printf '%s\n' "${summary[@]}"
} | tee "$logs/summary.txt"
if [ -n "$archive" ]; then
  tar czf "$archive" -C "$(dirname "$logs")" "$(basename "$logs")" && echo "logs packed into $archive"
fi
exit "$failed"
