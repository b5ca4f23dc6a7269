//! Cold start on CUDA (`--features gpu-tests`; needs a GPU): a fresh process with the driver's JIT
//! cache off loads the shipped cubin for its GPU and finishes its first op quickly, and the
//! PTX path (`OPSMITH_KERNEL_IMAGE=ptx`) computes the same bits as the cubins for every kernel
//! family. Each case runs in a child process, as module loading happens once per process.
use opsmith_host::cuda::{CudaDevice, prebuilt::IMAGE_ENV};
use opsmith_host::ops::{self, AdamStep};
use opsmith_host::{DType, Device, Labels, Tensor};
use opsmith_kernels::prebuilt::cubin_for;
use std::process::Command;
use std::time::Instant;

const GPU: Device = Device::Cuda(0);
const CHILD: &str = "OPSMITH_COLD_START_CHILD";

/// Runs the ignored test `name` of this binary in a fresh process with the JIT cache off, and
/// `image` as `OPSMITH_KERNEL_IMAGE`; returns its standard output.
fn child(name: &str, image: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("CUDA_CACHE_DISABLE", "1")
        .env(IMAGE_ENV, image)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{name} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The value after `key=` on the child's output line that starts with `key=`.
fn field<'a>(stdout: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    stdout.lines().find_map(|l| l.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("no {key} in:\n{stdout}"))
}

/// The child of `first_op_loads_the_cubin_and_is_fast`: the time from its first line to the
/// first op's result on the host, and the image the elementwise family came from.
#[test]
#[ignore = "run by first_op_loads_the_cubin_and_is_fast in a child process"]
fn first_op_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let start = Instant::now();
    let n = 1 << 20;
    let a = Tensor::from_vec((0..n).map(|i| (i % 7) as f32 - 3.0).collect(), [n], GPU).unwrap();
    let b = Tensor::from_vec(vec![1.5f32; n], [n], GPU).unwrap();
    let d = ops::fused_mul_add(&a, &b, &b).unwrap().to_vec::<f32>().unwrap();
    let elapsed = start.elapsed();
    for (i, v) in d.iter().enumerate() {
        assert_eq!(*v, ((i % 7) as f32 - 3.0) * 1.5 + 1.5, "element {i}");
    }
    let dev = CudaDevice::get(0).unwrap();
    let loaded = dev.loaded_modules();
    assert_eq!(loaded.len(), 1, "only the elementwise family is loaded: {loaded:?}");
    println!(); // libtest has printed "test first_op_child ... " without a newline
    println!("first_op_ms={:.3}", elapsed.as_secs_f64() * 1e3);
    println!("image={}", loaded[0].image);
    println!("load_ms={:.3}", loaded[0].load_time.as_secs_f64() * 1e3);
}

#[test]
fn first_op_loads_the_cubin_and_is_fast() {
    let (major, minor) = CudaDevice::get(0).unwrap().compute_capability().unwrap();
    let out = child("first_op_child", "auto");
    let image = field(&out, "image");
    let ms: f64 = field(&out, "first_op_ms").parse().unwrap();
    println!("sm_{major}{minor}: {image}, module load {} ms, first op {ms:.1} ms", field(&out, "load_ms"));
    match cubin_for(major, minor) {
        Some(arch) => assert_eq!(image, format!("sm_{arch} cubin")),
        None => assert!(image.contains("PTX"), "{image}"),
    }
    // Generous for a loaded CI machine; the figure itself is a benchmark (BENCHMARKS.md).
    if cubin_for(major, minor).is_some() {
        assert!(ms < 1000.0, "the first op took {ms} ms with a cubin");
    }
}

/// FNV-1a over the bits of every value, widened exactly to f64.
fn digest(t: &Tensor) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in t.to_vec_f64().unwrap() {
        for byte in v.to_bits().to_le_bytes() {
            h = (h ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Deterministic values in ±[0.25, 4), never zero.
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            let magnitude = 0.25 * 16f64.powf(u);
            if s & 1 == 0 { magnitude } else { -magnitude }
        })
        .collect()
}

/// The child of `ptx_and_cubins_compute_the_same_bits`: one or more kernels of every family in
/// every dtype they have, each result printed as a digest of its bits.
#[test]
#[ignore = "run by ptx_and_cubins_compute_the_same_bits in a child process"]
fn every_family_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mut lines = Vec::new();
    let mut record = |name: String, t: &Tensor| lines.push(format!("{name}={}", digest(t)));
    let n = 10_007; // not a multiple of any pack or block
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let t = |seed| Tensor::from_f64(&values(n, seed), [n], dtype, GPU).unwrap();
        let (a, b, c, g) = (t(1), t(2), t(3), t(4));
        record(format!("fused_mul_add_{dtype}"), &ops::fused_mul_add(&a, &b, &c).unwrap());
        record(format!("add_mul_{dtype}"), &ops::add_mul(&a, &b, &c).unwrap());
        let (gxy, gw) = ops::add_mul_backward(&g, &a, &b, &c).unwrap();
        record(format!("add_mul_backward_{dtype}"), &gxy);
        record(format!("add_mul_backward_w_{dtype}"), &gw);
        record(format!("affine_{dtype}"), &ops::affine(&a, 0.7, -0.2).unwrap());
        record(format!("gelu_{dtype}"), &ops::gelu(&a).unwrap());
        record(format!("gelu_backward_{dtype}"), &ops::gelu_backward(&g, &a).unwrap());
        record(format!("silu_backward_{dtype}"), &ops::silu_backward(&g, &a).unwrap());
        record(format!("sum_{dtype}"), &ops::sum(&a).unwrap());
        let m = Tensor::from_f64(&values(97 * 103, 5), [97, 103], dtype, GPU).unwrap();
        record(format!("sum_rows_{dtype}"), &ops::sum_rows(&m).unwrap());
        for cols in [100, 2000, 20_000] {
            let x = Tensor::from_f64(&values(7 * cols, 6), [7, cols], dtype, GPU).unwrap();
            let y = ops::softmax(&x, 0.5, None).unwrap();
            record(format!("softmax_{cols}_{dtype}"), &y);
            record(format!("softmax_backward_{cols}_{dtype}"), &ops::softmax_backward(&x, &y, 0.5).unwrap());
        }
        let logits = Tensor::from_f64(&values(33 * 10, 7), [33, 10], dtype, GPU).unwrap();
        let labels = Labels::new(&(0..33).map(|i| (i * 7 % 10) as u32).collect::<Vec<_>>(), GPU).unwrap();
        let loss = ops::cross_entropy(&logits, &labels).unwrap();
        record(format!("cross_entropy_{dtype}"), &loss);
        let one = Tensor::full(1.0, [], dtype, GPU).unwrap();
        record(
            format!("cross_entropy_backward_{dtype}"),
            &ops::cross_entropy_backward(&one, &logits, &labels).unwrap(),
        );
        record(format!("mse_{dtype}"), &ops::mse_loss(&a, &b).unwrap());
    }
    let t = |seed| Tensor::from_f64(&values(n, seed), [n], DType::F32, GPU).unwrap();
    let (param, grad, m, v) = (t(8), t(9), t(10), Tensor::from_f64(&vec![0.5; n], [n], DType::F32, GPU).unwrap());
    let step = AdamStep { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 3 };
    ops::adam_step(&param, &grad, &m, &v, &step).unwrap();
    for (name, t) in [("adam_param", &param), ("adam_m", &m), ("adam_v", &v)] {
        record(name.into(), t);
    }
    let images: Vec<String> = CudaDevice::get(0)
        .unwrap()
        .loaded_modules()
        .iter()
        .map(|m| format!("{}:{}", m.family.name(), m.image))
        .collect();
    println!(); // libtest has printed "test every_family_child ... " without a newline
    println!("images={}", images.join(";")); // image names hold commas
    for line in lines {
        println!("{line}");
    }
}

#[test]
fn ptx_and_cubins_compute_the_same_bits() {
    let (major, minor) = CudaDevice::get(0).unwrap().compute_capability().unwrap();
    let from_cubins = child("every_family_child", "auto");
    let from_ptx = child("every_family_child", "ptx");
    let results = |out: &str| -> Vec<String> {
        let digests = out.lines().filter(|l| l.split_once('=').is_some_and(|(k, _)| !k.contains(' ')));
        digests.filter(|l| !l.starts_with("images=")).map(String::from).collect()
    };
    let (cubin_results, ptx_results) = (results(&from_cubins), results(&from_ptx));
    // 19 results in each of three dtypes, and Adam's three tensors.
    assert_eq!(cubin_results.len(), 3 * 19 + 3, "results missing:\n{from_cubins}");
    assert_eq!(cubin_results, ptx_results, "the PTX path and the cubins disagree");
    // Six families ran (all but timing); each came from the image it was asked for.
    let (cubin_images, ptx_images) = (field(&from_cubins, "images"), field(&from_ptx, "images"));
    assert_eq!(ptx_images.split(';').count(), 6, "{ptx_images}");
    assert!(ptx_images.split(';').all(|i| i.contains("PTX")), "{ptx_images}");
    if let Some(arch) = cubin_for(major, minor) {
        assert!(cubin_images.split(';').all(|i| i.ends_with(&format!("sm_{arch} cubin"))), "{cubin_images}");
    }
    println!("{} results equal bit for bit; cubins: {cubin_images}; PTX: {ptx_images}", cubin_results.len());
}
