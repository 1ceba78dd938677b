#!/usr/bin/env bash
# The GPU checks and measurements of this device bundle (built by `cargo
# xtask device-bundle`; docs/gpu.md, "The device bundle", has the one
# procedure). Usage:
#   ./run.sh [--data-dir DIR] [--budget SECS] [--rounds N] [--only REGEX] [--logs DIR]
#            [--archive FILE] [--dry-run]
#
# Needs the NVIDIA driver and NVRTC (a CUDA toolkit or a pip wheel) only to
# load the kernels: their CUBINs for sm_90 come in kernels/, compiled and
# checked (ptxas registers and spills) where the bundle was built. PyTorch
# (the python on PATH or PYTHON=.../python) and Nsight Compute (ncu) are
# used when present.
#
# Steps run in order of value, each with its own time limit, all of them
# within --budget seconds (default 480, so that one 600 s remote command
# holds them with margin); a step with less than 15 s left is skipped.
# After every step, and on SIGTERM or SIGINT, logs/summary.txt is rewritten
# and (with --archive) the logs are packed again, so a call that is killed
# still brings back everything that finished.
# --rounds N repeats the training runs N times (default 3), round by round,
# so that the report shows their spread. --only runs just the steps whose
# names match the (bash) regex. --dry-run is for cuda-emu (no GPU), where a
# training step of 64 images takes seconds: it shows that every step runs
# and reports, not what it measures. Every training trains one step of 4
# images and evaluates 16 (the 10d9181 baseline, which cannot shorten its
# evaluation of 10,000 images, trains on the CPU), every bench times one
# repetition at batch 4, the parity suite runs its pointwise tests, nccl_gpu
# all but its training run and its own rerun on the emulator, and the
# rounds default to 1 (the others repeat the same commands).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data_dir="$here/data/fashion-mnist"
budget=480
rounds=
only=
logs="$here/logs"
archive=
dry_run=0
usage="usage: $0 [--data-dir DIR] [--budget SECS] [--rounds N] [--only REGEX] [--logs DIR] [--archive FILE] [--dry-run]"
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) data_dir=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --archive) archive=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
if [ -z "$rounds" ]; then
  rounds=3
  [ "$dry_run" = 1 ] && rounds=1
fi
deadline=$((SECONDS + budget))
links="$here/lib"
# Fresh links: a link left by an earlier run would be found first, and
# linked to itself.
rm -rf "$links"
mkdir -p "$logs" "$links"
python=${PYTHON:-python3}
# PyTorch runs with the caller's library path: it brings its own NCCL and NVRTC.
orig_ld=${LD_LIBRARY_PATH-}
summary=()
running=
pid=
start=0
row() { summary+=("$(printf '%-28s %-7s %s' "$1" "$2" "$3")"); }
# Whether --only selects step $1.
selected() { [ -z "$only" ] || [[ $1 =~ $only ]]; }
# A row for step $1 that cannot run here, for reason $2.
skip() { if selected "$1"; then row "$1" skipped "$2"; save; fi; }

# Writes logs/summary.txt and, with --archive, packs the logs folder again
# (into a temporary name first: a kill half way leaves the last archive).
save() {
  {
    echo "# $(head -n 1 "$here/build-info.txt" 2>/dev/null), budget $budget s, $SECONDS s so far${dry_run/#1/, dry run (batch 4, one step)}"
    printf '%-28s %-7s %s\n' step result detail
    printf '%s\n' "${summary[@]}"
  } >"$logs/summary.txt"
  if [ -n "$archive" ]; then
    tar czf "$archive.part" -C "$(dirname "$logs")" "$(basename "$logs")" 2>/dev/null &&
      mv -f "$archive.part" "$archive"
  fi
}
# SIGTERM or SIGINT: stop the running step, record it, pack what there is.
# shellcheck disable=SC2317 # called by the traps below
interrupted() {
  trap - TERM INT
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  [ -n "$running" ] && row "$running" FAIL "interrupted by SIG$1 after $((SECONDS - start)) s"
  save
  echo "interrupted by SIG$1; logs packed${archive:+ into $archive}" >&2
  exit 1
}
trap 'interrupted TERM' TERM
trap 'interrupted INT' INT

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
# The first library named $1* that the system loader knows, a CUDA install
# has, or (last: cuda-emu's, for a dry run) a folder of LD_LIBRARY_PATH has.
in_system() {
  {
    local dir dirs
    ldconfig -p 2>/dev/null | awk -v name="$1" 'index($1, name) == 1 { print $NF }'
    for dir in ${CUDA_HOME:-} /usr/local/cuda; do ls "$dir/lib64/$1"* 2>/dev/null; done
    IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH-}"
    for dir in "${dirs[@]}"; do [ -n "$dir" ] && ls "$dir/$1"* 2>/dev/null; done
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

# step NAME LIMIT PATTERN CMD...: runs CMD (if --only selects NAME and the
# budget leaves 15 s) for at most LIMIT seconds (less if the budget ends
# first), its output in $logs/NAME.log; a row with the last line matching
# PATTERN (else the last line), blanks squeezed; then saves.
step() {
  local name=$1 limit=$2 pattern=$3; shift 3
  selected "$name" || return 0
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 15 ]; then
    row "$name" skipped "out of time (--budget $budget)"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit $limit s): $*"
  start=$SECONDS
  running=$name
  timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1 &
  pid=$!
  wait "$pid"
  local status=$?
  pid=
  running=
  tail -n 3 "$logs/$name.log"
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
  save
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv,noheader 2>/dev/null | head -n 1)
if [ -n "$gpu" ]; then
  row gpu ok "$gpu"
elif [ "$dry_run" = 1 ]; then
  row gpu skipped "dry run: no nvidia-smi (cuda-emu's GPUs are the library's)"
else
  row gpu FAIL "nvidia-smi found no GPU"
fi
nvidia-smi >"$logs/nvidia-smi.log" 2>&1
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
# The CUBINs compiled where the bundle was built, one set per NVRTC version:
# the trainer reads those of the NVRTC it loads, and compiles (once, into
# the same folder) only if none match.
if [ -d "$here/kernels" ]; then
  export CORE_TENSOR_KERNEL_CACHE="$here/kernels"
  cp "$here/kernels/ptxas.txt" "$logs/ptxas.log" 2>/dev/null
  row kernels ok "$(find "$here/kernels" -name '*.cubin' | wc -l) CUBINs in kernels/ ($(cat "$here/kernels/nvrtc.txt" 2>/dev/null))"
else
  row kernels missing "no kernels/: the first trainer compiles them with NVRTC"
fi
save

# The flags of each training configuration: a precision and one lever.
config_flags() {
  case $1 in
    f32) flags=() ;;
    tf32) flags=(--tf32) ;;
    bf16) flags=(--bf16) ;;
    wide) flags=(--fp32-tile wide) ;;
    wide_tf32) flags=(--tf32 --fp32-tile wide) ;;
    cp_async) flags=(--gemm-staging cp-async) ;;
    cp_async_tf32) flags=(--tf32 --gemm-staging cp-async) ;;
    unfused) flags=(--no-fusion) ;;
    unfused_bf16) flags=(--bf16 --no-fusion) ;;
  esac
}
# A step's name for configuration $1: `train` for float32, else `train_$1`.
config_name() { if [ "$1" = f32 ]; then echo train; else echo "train_$1"; fi; }
quick=()
base_quick=()
base_device=cuda
dry_batch=
if [ "$dry_run" = 1 ]; then
  quick=(--max-steps 1 --eval-samples 16)
  base_quick=(--max-steps 1)
  base_device=cpu
  dry_batch=4
fi
# The batch a step asks for: $1, or in a dry run 4.
batch_of() { echo "${dry_batch:-$1}"; }
# The epochs a training asks for: $1, or in a dry run 1.
epochs_of() { if [ "$dry_run" = 1 ]; then echo 1; else echo "$1"; fi; }
trainer=("$here/bin/trainer" --device cuda --data-dir "$data_dir")
base=("$here/baseline/bin/trainer" --device "$base_device" --data-dir "$data_dir")
# train_round R: every goal run, then every variant beside its default and
# the baseline, once. Each run is a process of its own, 2 epochs (the
# report takes the last, warm one); round 1's batch-64 runs train 5 epochs
# for the accuracy goal.
train_round() {
  local r=$1 batch cfg epochs name
  for batch in 64 256 512; do
    for cfg in f32 tf32 bf16; do
      epochs=2
      [ "$r" = 1 ] && [ "$batch" = 64 ] && epochs=5
      config_flags "$cfg"
      name="$(config_name "$cfg")_b${batch}_r$r"
      step "$name" 60 'Epoch' "${trainer[@]}" "${flags[@]}" --batch-size "$(batch_of "$batch")" \
        --epochs "$(epochs_of "$epochs")" "${quick[@]}" --metrics "$logs/$name.jsonl"
    done
  done
  for batch in 64 512; do
    for cfg in cp_async cp_async_tf32 wide wide_tf32 unfused unfused_bf16; do
      config_flags "$cfg"
      name="$(config_name "$cfg")_b${batch}_r$r"
      step "$name" 60 'Epoch' "${trainer[@]}" "${flags[@]}" --batch-size "$(batch_of "$batch")" \
        --epochs "$(epochs_of 2)" "${quick[@]}" --metrics "$logs/$name.jsonl"
    done
    if [ -x "$here/baseline/bin/trainer" ]; then
      step "base_train_b${batch}_r$r" 60 'Epoch' "${base[@]}" --batch-size "$(batch_of "$batch")" \
        --epochs "$(epochs_of 2)" "${base_quick[@]}"
    fi
  done
}

# Nsight Compute at the GPU's own clocks (--clock-control none: locked base
# clocks distort every duration), with the metrics that test docs/gpu.md's
# predictions. An ncu that knows one of them not fails before profiling;
# then the step runs again with the common ones, and else with the
# sections alone, and the later steps keep that.
wanted_metrics=(
  gpu__time_duration.sum
  smsp__inst_executed.sum
  sm__throughput.avg.pct_of_peak_sustained_elapsed
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
  smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
  l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
  l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum
  l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum
)
common_metrics=(
  gpu__time_duration.sum
  smsp__inst_executed.sum
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
  l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum
)
metric_sets=("$(IFS=,; echo "${wanted_metrics[*]}")" "$(IFS=,; echo "${common_metrics[*]}")" "")
metric_set=0
have_ncu=0
command -v ncu >/dev/null && have_ncu=1
# ncu_detail NAME KERNELS SKIP COUNT FLAGS...: the sections and metrics of
# COUNT launches of the kernels matching the regex KERNELS, after SKIP.
ncu_detail() {
  local name=$1 kernels=$2 skip_n=$3 count=$4; shift 4
  while :; do
    local metrics=()
    [ -n "${metric_sets[$metric_set]}" ] && metrics=(--metrics "${metric_sets[$metric_set]}")
    step "$name" 90 '==PROF==|Duration' ncu --clock-control none --section LaunchStats \
      --section Occupancy --section ComputeWorkloadAnalysis --section SpeedOfLight \
      --section WarpStateStats "${metrics[@]}" --csv --kernel-name "$kernels" \
      --launch-skip "$skip_n" --launch-count "$count" "${trainer[@]}" "$@" --epochs 1 --max-steps 10
    [ "${#metrics[@]}" -gt 0 ] && [ -f "$logs/$name.log" ] &&
      grep -qiE '==ERROR==.*metric' "$logs/$name.log" || return 0
    # The row of the refused try goes; the log is kept beside.
    unset 'summary[${#summary[@]}-1]'
    mv -f "$logs/$name.log" "$logs/${name}_metrics_refused.txt"
    metric_set=$((metric_set + 1))
  done
}
# The GEMM kernels of variant $1's flags: conv2d_relu_fwd and conv2d_pool_fwd
# are the convs' forward products (fused with their ReLU and pool), fc1's
# linear_relu_fwd when unsplit; the wide tiles' kernels end in `_f32w` or
# `_tf32w`, the cp.async staging's add `_cp` (GEMM_VARIANTS in sgemm.cuh).
gemms() { echo "regex:^(conv2d|conv2d_pool|conv2d_relu|linear|linear_relu)_(fwd|bwd_input|bwd_weight)(_partial)?_$1\$"; }
# ncu_kernels NAME FLAGS...: the device time of 100 launches in the middle
# of a short training, every kernel.
ncu_kernels() {
  local name=$1; shift
  step "$name" 60 '==PROF==|gpu__time_duration' ncu --clock-control none --metrics \
    gpu__time_duration.sum --csv --launch-skip 400 --launch-count 100 "${trainer[@]}" "$@" \
    --epochs 1 --max-steps 40
}
# cnn_layers NAME FLAGS...: each layer's kernels between CUDA events.
reps=50
[ "$dry_run" = 1 ] && reps=1
# cnn_layers NAME BATCH FLAGS...
cnn_layers() {
  local name=$1 batch=$2; shift 2
  step "$name" 30 '^ +sum' "$here/benches/cnn_layers" --device cuda --reps "$reps" \
    --batch-size "$(batch_of "$batch")" "$@"
}

# 1. Correctness: the parity suite, then NCCL at world size 1.
parity=()
[ "$dry_run" = 1 ] && parity=(pointwise::)
step cuda_parity 60 'test result' env REQUIRE_GPU=1 "$here/tests/cuda_parity" "${parity[@]}"
if [ "$have_nccl" = 1 ]; then
  # A dry run is on cuda-emu already, and trains no full run there.
  nccl_skips=()
  [ "$dry_run" = 1 ] && nccl_skips=(--skip nccl_tests_on_the_cuda_emulator
    --skip two_ranks_on_one_gpu_train_over_tcp_under_auto)
  step nccl_gpu 60 'test result' env REQUIRE_GPU=1 REQUIRE_NCCL=1 \
    TRAINER_BIN="$here/bin/trainer" "$here/tests/nccl_gpu" --test-threads 1 "${nccl_skips[@]}"
else
  skip nccl_gpu "no libnccl"
fi

# 2. The goal runs and the levers beside them, once.
train_round 1

# 3. PyTorch, one process for every case (its own budget, its lines as they
# come): the anchor of the batch-256 and -512 goals.
if [ -n "$orig_ld" ]; then
  torch_env=(env PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="$orig_ld")
else
  torch_env=(env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1)
fi
if "${torch_env[@]}" "$python" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  torch_budget=120
  [ "$dry_run" = 1 ] && torch_budget=20
  step torch_suite $((torch_budget + 30)) 'img/s' "${torch_env[@]}" "$python" \
    "$here/pytorch/gpu_suite.py" --data-dir "$data_dir" --budget "$torch_budget"
else
  skip torch_suite "no torch that sees a GPU in $python (set PYTHON=.../python)"
fi

# 4. The spread: the same runs again.
[ "$rounds" -ge 2 ] && train_round 2

# 5. Why each GEMM kernel takes its time, bf16 and TF32 first (one training
# step's 12 launches after 24).
if [ "$have_ncu" = 1 ]; then
  ncu_detail ncu_detail_bf16 "$(gemms bf16)" 24 12 --bf16
  ncu_detail ncu_detail_tf32 "$(gemms tf32)" 24 12 --tf32
else
  skip ncu_detail_bf16 "no ncu on PATH"
fi

# 6. Each layer's kernels at the GPU's clocks, per precision and lever.
for batch in 64 512; do
  cnn_layers "bench_cnn_layers_b$batch" "$batch"
  cnn_layers "bench_cnn_layers_tf32_b$batch" "$batch" --tf32
  cnn_layers "bench_cnn_layers_bf16_b$batch" "$batch" --bf16
  cnn_layers "bench_cnn_layers_cp_async_b$batch" "$batch" --gemm-staging cp-async
  cnn_layers "bench_cnn_layers_cp_async_tf32_b$batch" "$batch" --tf32 --gemm-staging cp-async
  cnn_layers "bench_cnn_layers_wide_b$batch" "$batch" --fp32-tile wide
  cnn_layers "bench_cnn_layers_unfused_b$batch" "$batch" --no-fusion
done

# 7. Every kernel's device time in training, per precision.
if [ "$have_ncu" = 1 ]; then
  ncu_kernels ncu_kernels
  ncu_kernels ncu_kernels_tf32 --tf32
  ncu_kernels ncu_kernels_bf16 --bf16
fi

# 8. The third round.
[ "$rounds" -ge 3 ] && train_round 3

# 9. The other levers' kernels: float32, cp.async, the wide tiles (at batch
# 512, where conv2's products take them), the bias gradients' two passes.
if [ "$have_ncu" = 1 ]; then
  ncu_detail ncu_detail_f32 "$(gemms f32)" 24 12
  ncu_detail ncu_detail_cp_async "$(gemms f32_cp)" 24 12 --gemm-staging cp-async
  ncu_detail ncu_detail_cp_async_tf32 "$(gemms tf32_cp)" 24 12 --tf32 --gemm-staging cp-async
  ncu_detail ncu_detail_wide "$(gemms f32w)" 24 12 --fp32-tile wide --batch-size 512
  ncu_detail ncu_detail_wide_tf32 "$(gemms tf32w)" 24 12 --tf32 --fp32-tile wide --batch-size 512
  ncu_detail ncu_detail_bias 'regex:^conv2d_bwd_bias_' 8 4
  if [ -x "$here/baseline/bin/trainer" ]; then
    step base_ncu_kernels 60 '==PROF==|gpu__time_duration' ncu --clock-control none --metrics \
      gpu__time_duration.sum --csv --launch-skip 400 --launch-count 100 "${base[@]}" --epochs 1 \
      --max-steps 40
  fi
fi

# 10. Last, what 2026-11-27 settled: NCCL and two ranks over TCP training.
if [ "$have_nccl" = 1 ]; then
  step train_nccl 60 'Epoch' "${trainer[@]}" --backend nccl --epochs "$(epochs_of 2)" \
    ${dry_batch:+--batch-size "$dry_batch"} "${quick[@]}"
fi
step train_tcp_ws2 60 'Epoch' "${trainer[@]}" --world-size 2 --backend tcp --epochs "$(epochs_of 2)" \
  ${dry_batch:+--batch-size "$dry_batch"} "${quick[@]}"

echo
save
echo "== summary (logs in $logs${archive:+, packed into $archive})"
cat "$logs/summary.txt"
# Non-zero when a step failed.
! printf '%s\n' "${summary[@]}" | grep -qE '^[^ ]+ +FAIL '
