#!/usr/bin/env bash
# Runs a bundle made by scripts/gpu-bundle.sh on a GPU machine, and prints a summary table last.
#   run.sh [test|examples|sanitize|bench|all]     (default: all)
# sanitize runs compute-sanitizer's memcheck, racecheck, initcheck and synccheck over every GPU suite.
# bench needs python3 with PyTorch for the side-by-side comparison.
# Logs go to $LOG_DIR (default: ./logs).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
what=${1:-all}
logs=${LOG_DIR:-$here/logs}
mkdir -p "$logs"
summary=()

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

# Every GPU test target (named gpu*), plus the custom-op example's gradcheck, which runs on CUDA.
gpu_suites=()
for bin in "$here"/bin/test-*-gpu*; do gpu_suites+=("$(basename "$bin")"); done
gpu_suites+=(test-example-custom-op-gradcheck)
if [[ $what == test || $what == all ]]; then
  for suite in "$here"/bin/test-*; do
    run "$(basename "$suite")" "$suite"
  done
  # Again with every launch synchronized, the mode that pins an asynchronous fault to its launch.
  for suite in "${gpu_suites[@]}"; do
    OPSMITH_LAUNCH_BLOCKING=1 run "$suite-blocking" "$here/bin/$suite"
  done
fi
if [[ $what == examples || $what == test || $what == all ]]; then
  # The tutorial, in reading order; train_mlp writes the weights that serve loads.
  cd "$here"
  for example in quickstart vector_add fused_mul_add add_mul_backward; do
    [[ -x bin/$example ]] && run "$example" "bin/$example"
  done
  run custom_op bin/opsmith-example-custom-op
  run external_ptx bin/external_ptx
  run train_mlp bin/train_mlp
  run train_ddp bin/train_ddp
  run serve bin/opsmith-example-serve --once
  run doctor bin/doctor
  cd - >/dev/null
fi
if [[ $what == sanitize || $what == all ]]; then
  # The suite provokes driver API errors on purpose (bad PTX, unknown kernel names) to test its
  # error paths; those are not reported, so the summaries count memory and ordering errors only.
  # Skipped under the sanitizers: the reliability suite's kernel-fault test (it faults on purpose,
  # in a child process) and its 10^5-op memory test (it checks the driver's memory accounting,
  # not memory safety, and under racecheck it outlasts a 10-minute session).
  for suite in "${gpu_suites[@]}" test-example-custom-op-gradcheck; do
    for tool in memcheck racecheck initcheck synccheck; do
      [[ -x $here/bin/$suite ]] || continue
      run "$suite-$tool" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 1 \
        "$here/bin/$suite" --test-threads=1 --skip kernel_fault --skip a_hundred_thousand
    done
  done
fi
if [[ $what == bench || $what == all ]]; then
  run bandwidth "$here/bin/bandwidth" --out "$logs" --ptx "$(ls "$here"/ptx/*.ptx | head -1)"
  run torch-compare python3 "$here/torch_compare.py"
  # The CUDA groups of `cargo bench` (criterion); the CPU groups are better run where you build.
  run criterion "$here/bin/bench-fused" --bench cuda/
  grep -E "^\|" "$logs/bandwidth.log" "$logs/torch-compare.log" || true
fi

echo
echo "| step | result | time | last line |"
echo "|---|---|---|---|"
printf '%s\n' "${summary[@]}"
