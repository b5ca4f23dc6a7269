//! Event timing of GPU work, the way a benchmark should do it: warm-up runs first, then every
//! timed run queued behind a spin kernel, so the runs execute back to back on the GPU and each
//! pair of events measures the GPU's time for one run, not the host's pace; one synchronize at
//! the end.
use super::{Event, LaunchConfig, Stream};
use crate::Result;
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// The sorted durations of repeated runs of the same GPU work, in milliseconds.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::{Tensor, cuda::{self, CudaDevice}, ops};
/// let dev = CudaDevice::get(0)?;
/// let x = Tensor::from_vec(vec![1.5f32; 1 << 20], [1 << 20], dev.device())?;
/// let y = x.copy()?;
/// let t = cuda::time_runs(&dev.current_stream(), 3, 10, || ops::add_into(&x, &x, &y))?;
/// assert_eq!(t.samples_ms().len(), 10);
/// assert!(t.min_ms() <= t.median_ms() && t.median_ms() <= t.max_ms());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Timings {
    sorted_ms: Vec<f64>,
}

impl Timings {
    /// Every run's time, shortest first.
    pub fn samples_ms(&self) -> &[f64] {
        &self.sorted_ms
    }

    /// The median run (the upper one of the middle two for an even count); NaN for no runs.
    pub fn median_ms(&self) -> f64 {
        self.sorted_ms.get(self.sorted_ms.len() / 2).copied().unwrap_or(f64::NAN)
    }

    /// The shortest run; NaN for no runs.
    pub fn min_ms(&self) -> f64 {
        self.sorted_ms.first().copied().unwrap_or(f64::NAN)
    }

    /// The longest run; NaN for no runs.
    pub fn max_ms(&self) -> f64 {
        self.sorted_ms.last().copied().unwrap_or(f64::NAN)
    }
}

/// The longest the spin kernel holds the queue: long enough for the host to queue hundreds of
/// slow steps, short enough that a mis-estimate costs little.
const MAX_LEAD: Duration = Duration::from_millis(200);

/// Times `work`, which queues GPU work on `stream` (and on no other stream): `warmup` untimed
/// runs, then `reps` runs between pairs of events, medians and all in [`Timings`]. `work` may
/// return any error that an opsmith error converts into (an autograd error, say).
///
/// Before the timed runs, a spin kernel holds the stream for about twice as long as the host
/// took to queue one run, times `reps`, so that every timed run is queued before the GPU reaches
/// it: each run then starts as soon as the previous one ends, as in a pipeline, and launch
/// latency and host-side bookkeeping stay out of the numbers (unless the GPU's work per run is
/// shorter than the host's, which then shows as the host's pace). Inputs that fit in the L2
/// cache stay there between runs; size them past it to measure memory.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::{Tensor, cuda::{self, CudaDevice}, ops};
/// let dev = CudaDevice::get(0)?;
/// let n = 1 << 24;
/// let a = Tensor::from_vec(vec![1.25f32; n], [n], dev.device())?;
/// let d = a.copy()?;
/// let t = cuda::time_runs(&dev.current_stream(), 5, 30, || ops::fused_mul_add_into(&a, &a, &a, &d))?;
/// let bytes = 4.0 * 4.0 * n as f64; // three inputs read, one output written
/// println!("{:.1} GB/s", bytes / t.median_ms() / 1e6);
/// # Ok(()) }
/// ```
pub fn time_runs<E: From<crate::Error>>(
    stream: &Stream,
    warmup: usize,
    reps: usize,
    mut work: impl FnMut() -> std::result::Result<(), E>,
) -> std::result::Result<Timings, E> {
    for _ in 0..warmup {
        work()?;
    }
    stream.synchronize()?;
    // The host's time to queue one run, events included.
    let queued = Instant::now();
    let (a, b) = (stream.record_event()?, stream.record_event()?);
    work()?;
    let host_per_run = queued.elapsed();
    drop((a, b));
    stream.synchronize()?;

    let lead = (host_per_run * 2 * reps as u32).min(MAX_LEAD);
    spin(stream, lead)?;
    let mut pairs: Vec<(Event, Event)> = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = stream.record_event()?;
        work()?;
        pairs.push((start, stream.record_event()?));
    }
    let mut sorted_ms =
        pairs.iter().map(|(start, end)| start.elapsed_ms(end).map(f64::from)).collect::<Result<Vec<_>>>()?;
    sorted_ms.sort_by(f64::total_cmp);
    Ok(Timings { sorted_ms })
}

/// Queues a kernel on `stream` that keeps it busy for `time`.
fn spin(stream: &Stream, time: Duration) -> Result<()> {
    let kernel = stream.device().kernel(opsmith_kernels::names::SPIN)?;
    let mut ns = time.as_nanos().min(u64::MAX as u128) as u64;
    let mut params = [&mut ns as *mut u64 as *mut c_void];
    let cfg = LaunchConfig { grid: 1, block: 32, shared_mem_bytes: 0 };
    // SAFETY: `spin_ns(ns: u64)` takes one 64-bit parameter and touches no memory.
    unsafe { kernel.launch_raw(stream, cfg, &mut params) }
}
