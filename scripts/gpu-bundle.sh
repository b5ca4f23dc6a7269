#!/usr/bin/env bash
# Builds everything the GPU machine runs into one folder (default: gpu-bundle/, git-ignored):
# the GPU test binaries, the examples and the benches, and run.sh, which runs them there. The GPU machine needs the NVIDIA driver, nothing from Rust.
#
#   scripts/gpu-bundle.sh [OUT_DIR]
#   # copy OUT_DIR to the GPU machine, then: OUT_DIR/run.sh [test|sanitize|bench|all]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
rm -rf "$out"
mkdir -p "$out/bin"

executables() { # cargo's JSON messages on stdin -> "name path" for each built executable
  python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        package = m["package_id"].split("#")[-1].split("@")[0].removeprefix("opsmith-")
        target = m["target"]["name"]
        if m["target"]["kind"][0] == "bench":
            name = "bench-" + target
        elif m["profile"]["test"]:
            name = "test-" + package + "-" + target
        else:
            name = target
        print(name, m["executable"])'
}

echo "building test binaries" >&2
cargo test --release -p opsmith-host -p opsmith-autograd -p opsmith-example-custom-op -p opsmith-example-bias-gelu -p opsmith-example-serve \
  --features opsmith-host/gpu-tests,opsmith-autograd/gpu-tests --no-run --message-format=json \
  | executables | while read -r name path; do
    # Only the suites that use the GPU: the CPU suites run where the bundle is built (and in CI).
    case $name in test-*gpu* | test-example-*-gradcheck | test-example-serve-http) cp "$path" "$out/bin/$name" ;; esac
  done
echo "building examples" >&2
cargo build --release --examples -p opsmith -p opsmith-example-custom-op -p opsmith-example-bias-gelu -p opsmith-example-serve --bins --message-format=json \
  | executables | while read -r name path; do cp "$path" "$out/bin/$name"; done
echo "building the criterion benches" >&2
cargo bench --no-run -p opsmith -p opsmith-example-bias-gelu --message-format=json \
  | executables | while read -r name path; do cp "$path" "$out/bin/$name"; done
cp benches/torch_compare.py benches/torch_graph.py benches/attention_torch.py "$out/"

# Symbols and debug info are not needed there; the carry to a GPU machine is size-limited.
strip "$out"/bin/*
# Every binary also embeds the same 3.2 MB of compressed kernels; xz with a dictionary larger
# than the whole folder stores them once (111 MB of binaries pack to about 7 MB).
tar -C "$out" -cf - bin | xz -T1 --lzma2=preset=6,dict=128MiB >"$out/bin.tar.xz"
rm -rf "${out:?}/bin"
cp scripts/gpu-run.sh "$out/run.sh"
chmod +x "$out/run.sh"
xz -dc "$out/bin.tar.xz" | tar -t | grep "^bin/." >&2
echo "bundle ready: $out ($(du -sh "$out" | cut -f1))" >&2
