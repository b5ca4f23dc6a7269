//! Fused scaled dot-product attention on tensor cores (the attention family, sm_80 and newer).
//!
//! `out = softmax(scale · q·kᵀ) · v` for each of `heads` independent heads (batch × heads,
//! flattened), with `q`, `out` of `[heads, seq_q, D]` and `k`, `v` of `[heads, seq_k, D]`, all
//! contiguous, in f16 or bf16. Each block takes 128 queries of one head (64 in the narrow
//! forward, which the host picks for small causal grids) and walks the keys in tiles of 64: the
//! scores of a tile live in registers in f32, an online softmax rescales the running output as
//! each tile's maximum grows, and the `[seq_q, seq_k]` matrix never exists in memory. Beside
//! `out` the kernel writes each query's log-sum-exp (natural log, f32), from which the backward
//! recomputes the probabilities: `prep` (`Δ`, a zeroed f32 `dQ` accumulator), `backward` (one
//! block per 128 keys: `dK`, `dV`, and `dQ` by atomic adds) and `dq` (the accumulator rounded);
//! see `device::flash_backward`.
//!
//! The products run on `mma.sync.m16n8k16` (f32 accumulators), fed by `ldmatrix` from shared
//! memory that `cp.async` fills while the previous product runs; the shared-memory rows are
//! XOR-swizzled so that neither the copies nor `ldmatrix` meet bank conflicts. See
//! `device::flash` for the tile walk.
#[cfg(not(target_arch = "nvptx64"))]
use crate::names::AttentionKernels;

/// No attention kernel carries launch bounds today. The two-kernel backward's `dQ` kernel did
/// (three blocks a multiprocessor, 10% on an H100); the one-kernel backward needs its 255
/// registers, as the forward does.
#[cfg(not(target_arch = "nvptx64"))]
pub(crate) const LAUNCH_BOUNDS: &[crate::names::LaunchBounds] = &[];

macro_rules! attention_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            forward_d64: $f64:ident,
            forward_d128: $f128:ident,
            forward_narrow_d64: $fn64:ident,
            forward_narrow_d128: $fn128:ident,
            backward_prep_d64: $prep64:ident,
            backward_prep_d128: $prep128:ident,
            backward_d64: $b64:ident,
            backward_d128: $b128:ident,
            backward_dq: $dq:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: AttentionKernels = AttentionKernels {
            forward_d64: $f64,
            forward_d128: $f128,
            forward_narrow_d64: $fn64,
            forward_narrow_d128: $fn128,
            backward_prep_d64: $prep64,
            backward_prep_d128: $prep128,
            backward_d64: $b64,
            backward_d128: $b128,
            backward_dq: $dq,
        };

        // The head size, its packs of 8 per lane of four (`D / 32`); its k steps and pairs, its
        // 16-column pairs of dQ per warp; the streamed tile's rows, 8-row groups and 16-row
        // steps; copies per thread of an owned (128-row) and a streamed tile; shared bytes.
        attention_family!(@backward $prep64, $b64, $elem, 64, 2, 4, 2, 1, 32, 4, 2, 4, 1, 51456);
        attention_family!(@backward $prep128, $b128, $elem, 128, 4, 8, 4, 2, 32, 4, 2, 8, 2, 92416);
        attention_family!(@dq $dq, $elem);

        // The head size, its unroll counts D / 16, D / 32, D / 16, the 16-row tiles of a warp
        // with the scores of a thread (see `device::flash`), then for the docs the queries of a
        // warp and of a block and the shared-memory rows.
        attention_family!(@forward $f64, $elem, 64, 4, 2, 4, 2, 64, 32, 128, 256);
        attention_family!(@forward $f128, $elem, 128, 8, 4, 8, 2, 64, 32, 128, 256);
        attention_family!(@forward $fn64, $elem, 64, 4, 2, 4, 1, 32, 16, 64, 192);
        attention_family!(@forward $fn128, $elem, 128, 8, 4, 8, 1, 32, 16, 64, 192);
    };

    (@backward $prep:ident, $backward:ident, $elem:ty, $d:literal, $packs:literal, $k_steps:literal,
        $k_pairs:literal, $dq_pairs:literal, $stream:literal, $groups:literal, $steps:literal,
        $own_loads:literal, $stream_loads:literal, $shared:literal) => {
        // The launch docs' figure is the kernel's own layout.
        #[cfg(target_arch = "nvptx64")]
        const _: () = assert!(crate::device::flash_backward::backward_shared_bytes($d) == $shared);
        crate::kernel! {
            #[doc = concat!("The attention backward's first step for head_dim ", stringify!($d), ": `Δ` and a zeroed `dQ` accumulator.")]
            ///
            /// `delta[i] = Σ_c dout[i, c] · out[i, c]` for each of the `rows` query rows
            /// (`heads · seq_q`), and `dq_accum` set to zero, for the `backward` kernel.
            ///
            /// Launch with 128 threads per block and `ceil(rows / 32)` blocks.
            ///
            /// # Safety
            /// `out` and `dout` are valid for `rows · D` elements, `delta` for `rows` f32 and
            /// `dq_accum` for `rows · D` f32; every buffer is 16-byte aligned; `delta` and
            /// `dq_accum` overlap nothing else. 128 threads per block.
            pub unsafe fn $prep(
                out: *const [$elem; rows * $d],
                dout: *const [$elem; rows * $d],
                delta: *mut [f32; rows],
                dq_accum: *mut [f32; rows * $d],
                rows: u32,
            ) {
                // SAFETY: the kernel's contract is `backward_prep`'s.
                unsafe {
                    crate::device::flash_backward::backward_prep::<$elem, $d, $packs>(out, dout, delta, dq_accum, rows)
                }
            }
        }

        crate::kernel! {
            #[doc = concat!("The attention backward for head_dim ", stringify!($d), ": `dK`, `dV`, and `dQ` added to an f32 accumulator.")]
            ///
            /// With `P = exp(scale · q·kᵀ − lse)` over the keys each query sees (all, or `j <= i`
            /// with `causal != 0`), `dP = dout·vᵀ` and `dS = P ⊙ (dP − Δ)`: `dv = Pᵀ·dout`,
            /// `dk = scale · dSᵀ·q`, and `dq_accum += dS·k` (atomic adds, in an order that varies
            /// between runs). `lse` is the forward's (natural log), `delta` the `prep` kernel's;
            /// `scale_log2 = scale · log2(e)`.
            ///
            #[doc = concat!("Launch with 256 threads per block, `heads · ceil(seq_k / 128)` blocks and ", stringify!($shared), " bytes of dynamic shared memory.")]
            ///
            /// # Safety
            /// `q` and `dout` are valid for `heads · seq_q · D` elements, `k`, `v`, `dk` and `dv`
            /// for `heads · seq_k · D`, `lse` and `delta` for `heads · seq_q` f32, `dq_accum` for
            /// `heads · seq_q · D` f32; every buffer is 16-byte aligned; `dk`, `dv` and
            /// `dq_accum` overlap nothing else. 256 threads per block.
            pub unsafe fn $backward(
                q: *const [$elem; heads * seq_q * $d],
                k: *const [$elem; heads * seq_k * $d],
                v: *const [$elem; heads * seq_k * $d],
                dout: *const [$elem; heads * seq_q * $d],
                lse: *const [f32; heads * seq_q],
                delta: *const [f32; heads * seq_q],
                dk: *mut [$elem; heads * seq_k * $d],
                dv: *mut [$elem; heads * seq_k * $d],
                dq_accum: *mut [f32; heads * seq_q * $d],
                heads: u32,
                seq_q: u32,
                seq_k: u32,
                scale_log2: f32,
                scale: f32,
                causal: u32,
            ) {
                // SAFETY: the kernel's contract is `backward`'s.
                unsafe {
                    crate::device::flash_backward::backward::<
                        $elem, $d, $k_steps, $k_pairs, $dq_pairs, $stream, $groups, $steps, $own_loads, $stream_loads,
                    >(q, k, v, dout, lse, delta, dk, dv, dq_accum, heads, seq_q, seq_k, scale_log2, scale, causal != 0)
                }
            }
        }
    };

    (@dq $dq:ident, $elem:ty) => {
        crate::kernel! {
            /// The attention backward's last step: `dq = scale · dq_accum`, rounded.
            ///
            /// Grid-stride over the `n / 8` packs of 8 (`n` a multiple of 8, as every supported
            /// head size makes it).
            ///
            /// # Safety
            /// `dq_accum` is valid for `n` f32 and `dq` for `n` elements, both 16-byte aligned;
            /// `dq` overlaps nothing else.
            pub unsafe fn $dq(dq_accum: *const [f32; n], dq: *mut [$elem; n], n: u32, scale: f32) {
                // SAFETY: the kernel's contract is `backward_dq_finish`'s.
                unsafe { crate::device::flash_backward::backward_dq_finish::<$elem>(dq_accum, dq, n, scale) }
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
        backward_prep_d64: attention_backward_prep_d64_f16,
        backward_prep_d128: attention_backward_prep_d128_f16,
        backward_d64: attention_backward_d64_f16,
        backward_d128: attention_backward_d128_f16,
        backward_dq: attention_backward_dq_f16,
    }
}
attention_family! {
    /// The bf16 attention kernels.
    BF16, crate::dtype::Bf16, {
        forward_d64: attention_forward_d64_bf16,
        forward_d128: attention_forward_d128_bf16,
        forward_narrow_d64: attention_forward_narrow_d64_bf16,
        forward_narrow_d128: attention_forward_narrow_d128_bf16,
        backward_prep_d64: attention_backward_prep_d64_bf16,
        backward_prep_d128: attention_backward_prep_d128_bf16,
        backward_d64: attention_backward_d64_bf16,
        backward_d128: attention_backward_d128_bf16,
        backward_dq: attention_backward_dq_bf16,
    }
}
