#!/usr/bin/env bash
# Runs a bundle made by scripts/gpu-bundle.sh on a GPU machine, and prints a summary table last.
#   run.sh [test|examples|sanitize|graphs|attention|bench|coldstart|all]     (default: all)
#   graphs: the CUDA-graph step table (QUICK=1 for fewer repeats), also part of bench.
#   attention: attention_bench on the default and the composed path, and PyTorch's flash and cuDNN
#   backends on the same shapes (QUICK=1 for fewer sizes and repeats), also part of bench.
#   SUITES="test-host-gpu ..." and TOOLS="memcheck ..." narrow the GPU suites and sanitizer tools.
# sanitize runs compute-sanitizer's memcheck, racecheck, initcheck and synccheck over every GPU suite.
# bench needs python3 with PyTorch for the side-by-side comparison.
# Logs go to $LOG_DIR (default: ./logs).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
what=${1:-all}
logs=${LOG_DIR:-$here/logs}
mkdir -p "$logs"
# The bundle ships its binaries packed (scripts/gpu-bundle.sh); unpack them once.
if [[ -f $here/bin.tar.xz && ! -d $here/bin ]]; then
  if command -v xz >/dev/null; then
    xz -dc "$here/bin.tar.xz" | tar -C "$here" -x
  else # python's lzma reads the same format
    python3 -c 'import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])' "$here/bin.tar.xz" "$here"
  fi
fi
summary=()
# opsmith sets it itself before NCCL starts; set here too so no test thread changes the
# environment while others run. NVLink multicast can take shared GPUs out of service.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

run() { # name, command...
  local name=$1; shift
  local start=$SECONDS
  "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  local line
  line=$(grep -E "^test result:|ERROR SUMMARY|RACECHECK SUMMARY|^copy ceiling" "$logs/$name.log" | tail -1)
  summary+=("| $name | $([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)") | $((SECONDS - start)) s | ${line:-see log} |")
  return $rc
}

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} # NVLink multicast stays off on shared machines
# Every GPU test target (named gpu*); SUITES="a b" narrows the list.
gpu_suites=()
for bin in "$here"/bin/test-*gpu*; do gpu_suites+=("$(basename "$bin")"); done
[[ -n ${SUITES:-} ]] && read -r -a gpu_suites <<<"$SUITES"
if [[ $what == test || $what == all ]]; then
  for suite in "${gpu_suites[@]}" test-example-custom-op-gradcheck test-example-bias-gelu-gradcheck test-example-serve-http; do
    [[ -x $here/bin/$suite ]] && run "$suite" "$here/bin/$suite"
  done
  # Again with every launch synchronized, the mode that pins an asynchronous fault to its launch.
  for suite in "${gpu_suites[@]}"; do
    OPSMITH_LAUNCH_BLOCKING=1 run "$suite-blocking" "$here/bin/$suite"
  done
fi
if [[ $what == examples || $what == test || $what == all ]]; then
  # The tutorial in reading order, each checking its own results; train_mlp writes the weights
  # that serve loads (relative paths, so run from the bundle).
  cd "$here"
  for example in quickstart vector_add fused_mul_add add_mul_backward custom_op bias_gelu external_ptx train_mlp train_ddp; do
    [[ -x bin/$example ]] && run "$example" "bin/$example"
  done
  run train_mlp-graph bin/train_mlp --graph --out "$logs/mlp-graph.safetensors"
  [[ -x bin/opsmith-example-serve ]] && run serve bin/opsmith-example-serve --once
  run doctor bin/doctor
  cd - >/dev/null
fi
if [[ $what == sanitize || $what == all ]]; then
  # The suite provokes driver API errors on purpose (bad PTX, unknown kernel names) to test its
  # error paths; those are not reported, so the summaries count memory and ordering errors only.
  # Skipped under the sanitizers: the reliability suite's kernel-fault test (it faults on purpose,
  # in a child process) and its 10^5-op memory test (it checks the driver's memory accounting,
  # not memory safety, and under racecheck it outlasts a 10-minute session), and the matmul
  # suite's 1024^3 test (mostly timing; the smaller matmul tests make the same calls).
  read -r -a tools <<<"${TOOLS:-memcheck racecheck initcheck synccheck}"
  for suite in "${gpu_suites[@]}" test-example-custom-op-gradcheck test-example-bias-gelu-gradcheck; do
    for tool in "${tools[@]}"; do
      [[ -x $here/bin/$suite ]] || continue
      run "$suite-$tool" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 1 \
        "$here/bin/$suite" --test-threads=1 --skip kernel_fault --skip a_hundred_thousand \
        --skip large_product
    done
  done
fi
if [[ $what == coldstart || $what == all ]]; then
  # A fresh process's first CUDA op, with the driver's JIT cache off (as in a new container) and
  # on; wall time of whole processes with bash's `time`, and PyTorch's import + first op beside.
  cd "$here"
  wall() { # label, command... -> "| label | seconds |" from bash's clock, output to the log
    local label=$1; shift
    local t0=$EPOCHREALTIME
    "$@" >>"$logs/coldstart.log" 2>&1
    local rc=$?
    # train_mlp --steps 1 exits 1 for its accuracy promise (one step cannot keep it); its time counts.
    printf '| %s | %.3f | %s |\n' "$label" "$(awk "BEGIN { print $EPOCHREALTIME - $t0 }")" "$([ $rc -eq 0 ] && echo ok || echo "exit $rc")"
  }
  torch_first_op='import torch; x = torch.ones(1 << 20, device="cuda"); y = torch.addcmul(x, x, x); torch.cuda.synchronize(); assert y[0].item() == 2.0'
  {
    echo "| process (wall, whole process) | s | result |"
    echo "|---|---|---|"
    for cache in 1 0; do
      export CUDA_CACHE_DISABLE=$cache
      c=$([ $cache -eq 1 ] && echo "cache off" || echo "cache on")
      wall "cold_start, $c" bin/cold_start
      wall "cold_start, PTX forced, $c" env OPSMITH_KERNEL_IMAGE=ptx bin/cold_start
      wall "quickstart, $c" bin/quickstart
      wall "train_mlp --steps 1, $c" bin/train_mlp --steps 1 --out "$logs/mlp-coldstart.safetensors"
      wall "doctor, $c" bin/doctor
      wall "PyTorch: import + first addcmul, $c" python3 -c "$torch_first_op"
    done
    unset CUDA_CACHE_DISABLE
  } >"$logs/coldstart-table.md"
  summary+=("| coldstart | ok | - | see coldstart-table.md |")
  cat "$logs/coldstart-table.md"
  grep -E "^\||first CUDA result" "$logs/coldstart.log" || true
  cd - >/dev/null
fi
if [[ $what == graphs || $what == bench || $what == all ]]; then
  # Training steps as CUDA graphs, opsmith and PyTorch in the same call.
  run graph-step "$here/bin/graph_step" ${QUICK:+--quick}
  # The same steps recorded as one chain, as the stream ran them, for the branches' share.
  OPSMITH_GRAPH_BRANCHES=0 run graph-step-chain "$here/bin/graph_step" ${QUICK:+--quick}
  # The same steps with every matrix product on cuBLAS, for the small-product kernels' share.
  OPSMITH_SMALL_MATMUL=0 run graph-step-cublas "$here/bin/graph_step" ${QUICK:+--quick}
  run torch-graph python3 "$here/torch_graph.py" ${QUICK:+--quick}
  grep -E "^\||^check" "$logs/graph-step.log" "$logs/graph-step-chain.log" "$logs/torch-graph.log" || true
fi
if [[ $what == attention || $what == bench || $what == all ]]; then
  # Scaled dot-product attention (#20): whatever path opsmith picks; the composed path forced,
  # forward only to keep it to minutes (it writes [b, h, s, s] scores, and when causal builds
  # its mask on the host every call); PyTorch's backends. A size that fails shows as skipped.
  run attention "$here/bin/attention_bench" ${QUICK:+--quick}
  OPSMITH_FUSED_ATTENTION=0 run attention-composed "$here/bin/attention_bench" --no-backward ${QUICK:+--quick}
  run attention-torch python3 "$here/attention_torch.py" ${QUICK:+--quick}
  grep -E "^\|" "$logs/attention.log" "$logs/attention-composed.log" "$logs/attention-torch.log" || true
fi
if [[ $what == bench || $what == all ]]; then
  run bandwidth "$here/bin/bandwidth" --out "$logs"
  run torch-compare python3 "$here/torch_compare.py"
  # The CUDA groups of `cargo bench` (criterion); the CPU groups are better run where you build.
  run criterion "$here/bin/bench-fused" --bench cuda/
  run bias-gelu-bandwidth "$here/bin/bench-bias_gelu_bandwidth"
  grep -E "^\|" "$logs/bandwidth.log" "$logs/torch-compare.log" "$logs/bias-gelu-bandwidth.log" || true
fi

echo
echo "| step | result | time | last line |"
echo "|---|---|---|---|"
printf '%s\n' "${summary[@]}"
