#!/usr/bin/env python3
"""Checks the models `export_onnx` wrote: ONNX's full checker, then onnxruntime against opsmith.

    python3 scripts/onnx_check.py [DIR]   # default target/onnx

For each DIR/<name>.onnx with its DIR/<name>.json (sample inputs and opsmith's CPU outputs):
  * onnx.checker.check_model(full_check=True): the schema, the opsets, shape inference;
  * onnxruntime (CPU) runs it on the inputs; each output must match opsmith's:
      - f32: max |ort - opsmith| <= 1e-5 * max |opsmith|  (relative to the output's scale);
      - f16: max |ort - opsmith| <= 2^-7 * max |opsmith|: 16 unit roundoffs of f16 (2^-11),
        as each side rounds every intermediate to f16, in its own order of operations.
A model whose inputs all have a symbolic first dimension also runs on the first 3 rows, which
must give the first 3 rows of its outputs (within the same tolerance). Prints a line per output and exits 1 if any model fails.
"""
import glob
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

TOLERANCE = {"float32": 1e-5, "float16": 2.0**-7, "float64": 1e-12}


def array(spec):
    values = np.array(spec["values"], dtype=np.float64).reshape(spec["dims"])
    return values.astype(np.dtype(spec["dtype"]))


def check(path):
    sample_path = path[: -len(".onnx")] + ".json"
    with open(sample_path) as f:
        sample = json.load(f)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {name: array(spec) for name, spec in sample["inputs"].items()}
    names = [o.name for o in session.get_outputs()]
    results = dict(zip(names, session.run(names, feeds)))
    ok = True
    for name, spec in sample["outputs"].items():
        expected = array(spec).astype(np.float64)
        got = np.asarray(results[name]).astype(np.float64)
        if got.shape != expected.shape:
            print(f"FAIL {os.path.basename(path)} {name}: shape {got.shape}, opsmith {expected.shape}")
            ok = False
            continue
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
        error = float(np.max(np.abs(got - expected))) if expected.size else 0.0
        tolerance = TOLERANCE[spec["dtype"]] * max(scale, np.finfo(np.float32).tiny)
        passed = error <= tolerance
        ok &= passed
        print(
            f"{'ok  ' if passed else 'FAIL'} {os.path.basename(path):<24} {name:<6} {spec['dtype']:<8} "
            f"shape {str(list(got.shape)):<9} max|ort-opsmith| {error:.2e} "
            f"({error / scale if scale else 0.0:.2e} of max|y| {scale:.3g}; tolerance {TOLERANCE[spec['dtype']]:.1e})"
        )
    # A model whose every input has a symbolic first dimension (a batch) must also run on a
    # batch of another size: rows of the sample must give the same rows of the outputs.
    dynamic = all(i.shape and isinstance(i.shape[0], str) for i in session.get_inputs())
    if dynamic:
        rows = 3
        part = session.run(names, {name: value[:rows] for name, value in feeds.items()})
        for name, got in zip(names, part):
            full = np.asarray(results[name]).astype(np.float64)
            got = np.asarray(got).astype(np.float64)
            error = float(np.max(np.abs(got - full[:rows])))
            tolerance = TOLERANCE[str(results[name].dtype)] * float(np.max(np.abs(full)))
            same = got.shape == full[:rows].shape and error <= tolerance
            ok &= same
            print(f"{'ok  ' if same else 'FAIL'} {os.path.basename(path):<24} {name:<6} batch of {rows}: "
                  f"shape {list(got.shape)}, max|difference| from the full batch's rows {error:.2e}")
    return ok


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "target/onnx"
    models = sorted(glob.glob(os.path.join(directory, "*.onnx")))
    if not models:
        sys.exit(f"no .onnx files in {directory}: run `cargo run --release -p opsmith-example-export-onnx` first")
    print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}, {len(models)} models in {directory}")
    failed = [m for m in models if not check(m)]
    if failed:
        sys.exit(f"{len(failed)} of {len(models)} models failed: {', '.join(map(os.path.basename, failed))}")
    print(f"all {len(models)} models pass the checker and match opsmith in onnxruntime")


if __name__ == "__main__":
    main()
