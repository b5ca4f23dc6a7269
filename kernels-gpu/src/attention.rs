//! Fused scaled dot-product attention on tensor cores (the attention family, sm_80 and newer).
//!
//! `out = softmax(scale · q·kᵀ) · v` for each of `heads` independent heads (batch × heads,
//! flattened), with `q`, `out` of `[heads, seq_q, D]` and `k`, `v` of `[heads, seq_k, D]`, all
//! contiguous, in f16 or bf16. Each block takes 128 queries of one head (64 in the narrow
//! forward, which the host picks for small causal grids) and walks the keys in tiles of 64: the
//! scores of a tile live in registers in f32, an online softmax rescales the running output as
//! each tile's maximum grows, and the `[seq_q, seq_k]` matrix never exists in memory. Beside `out` the kernel writes each query's log-sum-exp (natural log, f32), from which
//! a backward recomputes the probabilities.
//!
//! The products run on `mma.sync.m16n8k16` (f32 accumulators), fed by `ldmatrix` from shared
//! memory that `cp.async` fills while the previous product runs; the shared-memory rows are
//! XOR-swizzled so that neither the copies nor `ldmatrix` meet bank conflicts. See
//! `device::flash` for the tile walk.
#[cfg(not(target_arch = "nvptx64"))]
use crate::names::AttentionKernels;

/// Three 4-warp blocks a multiprocessor (12 warps) for the `dQ` kernels: `ptxas` fits them in
/// 168 registers without spilling, where left alone it takes 172 and two blocks fit. On an H100
/// (bf16, head_dim 128, seq 4096) this made the backward 10% faster. The forward (32 query rows
/// a warp) needs its 255 registers, and the `dK`/`dV` kernel spills at 168: both keep them.
#[cfg(not(target_arch = "nvptx64"))]
pub(crate) const LAUNCH_BOUNDS: &[crate::names::LaunchBounds] = &{
    const KERNELS: [&str; 4] = [
        "attention_backward_dq_d64_f16",
        "attention_backward_dq_d128_f16",
        "attention_backward_dq_d64_bf16",
        "attention_backward_dq_d128_bf16",
    ];
    let mut bounds = [crate::names::LaunchBounds { kernel: "", max_threads: 128, min_blocks: 3 }; 4];
    let mut i = 0;
    while i < KERNELS.len() {
        bounds[i].kernel = KERNELS[i];
        i += 1;
    }
    bounds
};

macro_rules! attention_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            forward_d64: $f64:ident,
            forward_d128: $f128:ident,
            forward_narrow_d64: $fn64:ident,
            forward_narrow_d128: $fn128:ident,
            backward_dq_d64: $dq64:ident,
            backward_dq_d128: $dq128:ident,
            backward_dkdv_d64: $dkdv64:ident,
            backward_dkdv_d128: $dkdv128:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: AttentionKernels = AttentionKernels {
            forward_d64: $f64,
            forward_d128: $f128,
            forward_narrow_d64: $fn64,
            forward_narrow_d128: $fn128,
            backward_dq_d64: $dq64,
            backward_dq_d128: $dq128,
            backward_dkdv_d64: $dkdv64,
            backward_dkdv_d128: $dkdv128,
        };

        // The head size; its k steps and pairs; the streamed tile's rows, 8-row groups and
        // 16-row steps; copies per thread of an owned (64-row) and a streamed tile.
        attention_family!(@backward $dq64, $dkdv64, $elem, 64, 4, 2, 32, 4, 2, 4, 2);
        attention_family!(@backward $dq128, $dkdv128, $elem, 128, 8, 4, 32, 4, 2, 8, 4);

        // The head size, its unroll counts D / 16, D / 32, D / 16, the 16-row tiles of a warp
        // with the scores of a thread (see `device::flash`), then for the docs the queries of a
        // warp and of a block and the shared-memory rows.
        attention_family!(@forward $f64, $elem, 64, 4, 2, 4, 2, 64, 32, 128, 256);
        attention_family!(@forward $f128, $elem, 128, 8, 4, 8, 2, 64, 32, 128, 256);
        attention_family!(@forward $fn64, $elem, 64, 4, 2, 4, 1, 32, 16, 64, 192);
        attention_family!(@forward $fn128, $elem, 128, 8, 4, 8, 1, 32, 16, 64, 192);
    };

    (@backward $dq:ident, $dkdv:ident, $elem:ty, $d:literal, $k_steps:literal, $k_pairs:literal,
        $stream:literal, $groups:literal, $steps:literal, $own_loads:literal, $stream_loads:literal) => {
        crate::kernel! {
            #[doc = concat!("The attention backward's `dQ` for head_dim ", stringify!($d), ", and `Δ`.")]
            ///
            /// With `P = exp(scale · q·kᵀ − lse)` over the keys each query sees (all, or `j <= i`
            /// with `causal != 0`), `dP = dout·vᵀ` and `Δ_i = Σ_c dout_ic · out_ic`:
            /// `dq = scale · (P ⊙ (dP − Δ))·k`. Writes `Δ` to `delta` for the `dkdv` kernel.
            /// `lse` is the forward's (natural log); `scale_log2 = scale · log2(e)`.
            ///
            /// Launch with 128 threads per block and `heads · ceil(seq_q / 64)` blocks; 48 KiB
            /// (head_dim 128) or 24 KiB (64) of static shared memory.
            ///
            /// # Safety
            /// `q`, `out`, `dout` and `dq` are valid for `heads · seq_q · D` elements, `k` and
            /// `v` for `heads · seq_k · D`, `lse` and `delta` for `heads · seq_q` f32; every buffer
            /// is 16-byte aligned; `dq` and `delta` overlap nothing else. 128 threads per block.
            pub unsafe fn $dq(
                q: *const [$elem; heads * seq_q * $d],
                k: *const [$elem; heads * seq_k * $d],
                v: *const [$elem; heads * seq_k * $d],
                out: *const [$elem; heads * seq_q * $d],
                dout: *const [$elem; heads * seq_q * $d],
                lse: *const [f32; heads * seq_q],
                delta: *mut [f32; heads * seq_q],
                dq: *mut [$elem; heads * seq_q * $d],
                heads: u32,
                seq_q: u32,
                seq_k: u32,
                scale_log2: f32,
                scale: f32,
                causal: u32,
            ) {
                // SAFETY: the kernel's contract is `backward_dq`'s.
                unsafe {
                    crate::device::flash_backward::backward_dq::<
                        $elem, $d, $k_steps, $k_pairs, $stream, $groups, $steps, $own_loads, $stream_loads,
                    >(q, k, v, out, dout, lse, delta, dq, heads, seq_q, seq_k, scale_log2, scale, causal != 0)
                }
            }
        }

        crate::kernel! {
            #[doc = concat!("The attention backward's `dK` and `dV` for head_dim ", stringify!($d), ".")]
            ///
            /// `dv = Pᵀ·dout` and `dk = scale · (P ⊙ (dP − Δ))ᵀ·q`, with `P`, `dP` and `Δ` as for
            /// the `dq` kernel, whose `delta` this one reads (launch it after).
            ///
            /// Launch with 128 threads per block and `heads · ceil(seq_k / 64)` blocks; shared
            /// memory as the `dq` kernel.
            ///
            /// # Safety
            /// `q` and `dout` are valid for `heads · seq_q · D` elements, `k`, `v`, `dk` and `dv`
            /// for `heads · seq_k · D`, `lse` and `delta` for `heads · seq_q` f32; every buffer is
            /// 16-byte aligned; `dk` and `dv` overlap nothing else. 128 threads per block.
            pub unsafe fn $dkdv(
                q: *const [$elem; heads * seq_q * $d],
                k: *const [$elem; heads * seq_k * $d],
                v: *const [$elem; heads * seq_k * $d],
                dout: *const [$elem; heads * seq_q * $d],
                lse: *const [f32; heads * seq_q],
                delta: *const [f32; heads * seq_q],
                dk: *mut [$elem; heads * seq_k * $d],
                dv: *mut [$elem; heads * seq_k * $d],
                heads: u32,
                seq_q: u32,
                seq_k: u32,
                scale_log2: f32,
                scale: f32,
                causal: u32,
            ) {
                // SAFETY: the kernel's contract is `backward_dkdv`'s.
                unsafe {
                    crate::device::flash_backward::backward_dkdv::<
                        $elem, $d, $k_steps, $k_pairs, $stream, $groups, $steps, $own_loads, $stream_loads,
                    >(q, k, v, dout, lse, delta, dk, dv, heads, seq_q, seq_k, scale_log2, scale, causal != 0)
                }
            }
        }
    };

    (@forward $name:ident, $elem:ty, $d:literal, $k_steps:literal, $k_pairs:literal, $loads:literal,
        $rows:literal, $masks:literal, $warp_rows:literal, $block_rows:literal, $shared_rows:literal) => {
        crate::kernel! {
            #[doc = concat!("The attention forward for head_dim ", stringify!($d), ".")]
            ///
            /// `out[h, i] = Σ_j softmax_j(scale · q[h, i]·k[h, j]) · v[h, j]` and
            /// `lse[h, i] = ln Σ_j exp(scale · q[h, i]·k[h, j])`, the sums over the keys `j`
            /// query `i` may see: all `seq_k` of them, or with `causal != 0` those with `j <= i`
            /// (top-left aligned). A query that sees no key gets zeros and `lse = -inf`.
            /// `scale_log2` is `scale · log2(e)`.
            ///
            #[doc = concat!("Launch with 128 threads per block (four warps of ", stringify!($warp_rows), " queries), `heads · ceil(seq_q / ", stringify!($block_rows), ")` blocks, and `", stringify!($shared_rows), " · D · 2` bytes of dynamic shared memory: a ", stringify!($block_rows), "-row tile of `q` and a 64-row tile each of `k` and `v`.")]
            ///
            /// # Safety
            /// `q` and `out` are valid for `heads · seq_q · D` elements, `k` and `v` for
            /// `heads · seq_k · D`, `lse` for `heads · seq_q` f32; every buffer is 16-byte
            /// aligned; `out` and `lse` overlap nothing else. The block is 128 threads.
            pub unsafe fn $name(
                q: *const [$elem; heads * seq_q * $d],
                k: *const [$elem; heads * seq_k * $d],
                v: *const [$elem; heads * seq_k * $d],
                out: *mut [$elem; heads * seq_q * $d],
                lse: *mut [f32; heads * seq_q],
                heads: u32,
                seq_q: u32,
                seq_k: u32,
                scale_log2: f32,
                causal: u32,
            ) {
                // SAFETY: the kernel's contract is `forward`'s.
                unsafe {
                    crate::device::flash::forward::<$elem, $d, $k_steps, $k_pairs, $loads, $rows, $masks>(
                        q, k, v, out, lse, heads, seq_q, seq_k, scale_log2, causal != 0,
                    )
                }
            }
        }
    };
}

attention_family! {
    /// The f16 attention kernels.
    F16, crate::dtype::F16, {
        forward_d64: attention_forward_d64_f16,
        forward_d128: attention_forward_d128_f16,
        forward_narrow_d64: attention_forward_narrow_d64_f16,
        forward_narrow_d128: attention_forward_narrow_d128_f16,
        backward_dq_d64: attention_backward_dq_d64_f16,
        backward_dq_d128: attention_backward_dq_d128_f16,
        backward_dkdv_d64: attention_backward_dkdv_d64_f16,
        backward_dkdv_d128: attention_backward_dkdv_d128_f16,
    }
}
attention_family! {
    /// The bf16 attention kernels.
    BF16, crate::dtype::Bf16, {
        forward_d64: attention_forward_d64_bf16,
        forward_d128: attention_forward_d128_bf16,
        forward_narrow_d64: attention_forward_narrow_d64_bf16,
        forward_narrow_d128: attention_forward_narrow_d128_bf16,
        backward_dq_d64: attention_backward_dq_d64_bf16,
        backward_dq_d128: attention_backward_dq_d128_bf16,
        backward_dkdv_d64: attention_backward_dkdv_d64_bf16,
        backward_dkdv_d128: attention_backward_dkdv_d128_bf16,
    }
}
