//! An HTTP inference service that embeds opsmith: it serves the MLP that the `train_mlp`
//! example writes, batching concurrent requests onto worker threads that each own a CUDA stream
//! (or run on the CPU when there is no GPU).
//!
//! * `POST /v1/predict` takes `{"inputs": [[f32; features], ...]}` and answers
//!   `{"outputs": [{"class": k, "probabilities": [...]}, ...]}`, one output per input row.
//! * `GET /metrics` answers the service's metrics in the Prometheus text format: requests by
//!   route and status, latency and batch-size histograms, the queue's depth (see [`metrics`]).
//! * `GET /healthz` answers `{"status": "ok", "device": ..., "sizes": [...], "workers": n,
//!   "workers_alive": n, "inference_panics": 0, ...}`; `"degraded"` (still 200) with a
//!   `"reason"` when some workers have stopped, and 503 `"unavailable"` when none is left, so a
//!   load balancer stops sending requests that could not be answered.
//!
//! Bad requests get a 4xx and a JSON `{"error": "..."}` that says what is wrong: malformed JSON
//! (400), a body that is not JSON (415), a wrong feature count, an empty batch, an input that is
//! not a finite f32, or a row whose result overflows f32 inside the model (422, naming the row;
//! never a 200 with `null` probabilities), too many rows or too large a body (413), a body that
//! does not arrive within [`Config::body_timeout`] (408). When the queue is full, or a request
//! is not answered within [`Config::request_timeout`], the answer is 503: retry later.
//!
//! Requests are merged: a worker takes the first waiting request, then whatever else arrives
//! within [`Config::max_wait`], up to [`Config::max_merged_rows`] rows, runs them as one batch
//! (one GEMM per layer instead of one per request) and splits the answer.
//!
//! # Reliability
//!
//! * **Slow or stuck clients cannot hold the service.** [`Server`] caps open connections at
//!   [`Config::max_connections`] (more wait in the listen backlog until one closes, as Go's
//!   `LimitListener`) and closes a connection whose request head has not fully arrived within
//!   [`Config::header_timeout`] (counted from the connection opening or the previous answer, so
//!   it is also the keep-alive idle timeout), or that has not taken any of its answer for
//!   [`Config::send_timeout`]. A body that is not in within [`Config::body_timeout`] gets 408,
//!   and any request not answered within [`Config::request_timeout`] gets 503. These need
//!   [`Server::serve`]; a [`router`] mounted in another axum app keeps the body and request
//!   timeouts, and leaves the connection limits to that app's server.
//! * **A panic fails one request, not the service.** Inference runs under `catch_unwind`: a
//!   panic is a 500 for the requests of that batch, and when a merged batch fails, its requests
//!   are run again one by one so that only the culprit gets the error. Workers never run
//!   inference while they hold the queue's lock, so a failing request cannot stall the others,
//!   and `/healthz` reports the workers that are really running.
//! * **Bad configurations and model files fail at start.** [`Config::validate`] (run by
//!   [`router`] and [`Server::new`]) names the field at fault in a [`ConfigError`]; a model file
//!   is checked whole by [`Model::load`].
//!
//! # Logs
//!
//! The service emits [`tracing`] events: each answered request at `debug`, 5xx answers,
//! a full queue and connection failures at `warn`, inference panics and stopped workers at
//! `error`. The `serve` binary installs a subscriber (text or JSON, see [`cli::Args`]); a program
//! that mounts [`router`] keeps its own.
//!
//! The defaults ([`Config::default`]) suit a service behind a load balancer on a fast network:
//! 10 s for headers, body and each stalled send, 30 s per request, 1,024 connections.
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use opsmith::autograd::nn::Mlp;
use opsmith::autograd::{Var, no_grad};
use opsmith::{Device, Tensor, ops};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot, watch};

pub mod cli;
pub mod metrics;
#[cfg(test)]
mod tests;

use metrics::Metrics;

/// The service's limits, timeouts and batching. [`Config::validate`] says which values work.
#[derive(Clone, Debug)]
pub struct Config {
    /// Worker threads, each with its own CUDA stream (1 to 1,024).
    pub workers: usize,
    /// The most rows one request may carry (more is a 413).
    pub max_request_rows: usize,
    /// The most rows a worker merges into one batch (at least `max_request_rows`).
    pub max_merged_rows: usize,
    /// How long a worker waits for more requests after the first before it runs the batch
    /// (less than `request_timeout`).
    pub max_wait: Duration,
    /// Requests waiting beyond this many get a 503.
    pub queue_capacity: usize,
    /// The largest request body accepted (more is a 413).
    pub max_body_bytes: usize,
    /// The most connections [`Server`] keeps open (1 to 2^20); more wait in the listen backlog
    /// until one closes.
    pub max_connections: usize,
    /// How long a client has to send a request's line and headers, counted from the connection
    /// opening or the previous answer (so it is also the keep-alive idle timeout). Then
    /// [`Server`] closes the connection without an answer.
    pub header_timeout: Duration,
    /// How long a client has to send the body of a `POST /v1/predict`, once its headers are in
    /// (more is a 408, and the connection closes).
    pub body_timeout: Duration,
    /// The most a request may take from its headers to its answer: body, queue and inference
    /// (more is a 503).
    pub request_timeout: Duration,
    /// How long [`Server`] waits for a client that reads none of its answer before it closes
    /// the connection.
    pub send_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: 2,
            max_request_rows: 1024,
            max_merged_rows: 4096,
            max_wait: Duration::from_millis(2),
            queue_capacity: 4096,
            max_body_bytes: 4 << 20,
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(10),
        }
    }
}

/// The most worker threads.
const MAX_WORKERS: usize = 1024;
/// The most connections (a semaphore's permits, which must fit a `u32`).
const MAX_CONNECTIONS: usize = 1 << 20;
/// The longest timeout: longer is a mistake, and `Instant + Duration` would overflow near `Duration::MAX`.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// A [`Config`] field with a value the service cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad config: `{field}` {reason}")]
pub struct ConfigError {
    /// The field, as named in [`Config`].
    pub field: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

impl Config {
    /// Checks every field, in the order they are declared, and names the first bad one. A zero
    /// count or timeout, fewer merged rows than request rows, a timeout over a day, or a
    /// `max_wait` no shorter than `request_timeout` (every merged request would time out) are
    /// errors.
    ///
    /// ```
    /// use opsmith_example_serve::Config;
    /// use std::time::Duration;
    /// assert!(Config::default().validate().is_ok());
    /// let bad = Config { max_wait: Duration::MAX, ..Config::default() };
    /// assert_eq!(bad.validate().unwrap_err().field, "max_wait");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |field: &'static str, reason: String| Err(ConfigError { field, reason });
        if !(1..=MAX_WORKERS).contains(&self.workers) {
            return fail("workers", format!("is {}; it must be between 1 and {MAX_WORKERS}", self.workers));
        }
        if self.max_request_rows == 0 {
            return fail("max_request_rows", "is 0; it must be at least 1".into());
        }
        if self.max_merged_rows < self.max_request_rows {
            return fail(
                "max_merged_rows",
                format!(
                    "is {}; it must be at least max_request_rows ({})",
                    self.max_merged_rows, self.max_request_rows
                ),
            );
        }
        if self.queue_capacity == 0 {
            return fail("queue_capacity", "is 0; it must be at least 1".into());
        }
        if self.max_body_bytes == 0 {
            return fail("max_body_bytes", "is 0; it must be at least 1".into());
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return fail(
                "max_connections",
                format!("is {}; it must be between 1 and {MAX_CONNECTIONS}", self.max_connections),
            );
        }
        for (field, value) in [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("request_timeout", self.request_timeout),
            ("send_timeout", self.send_timeout),
        ] {
            if value.is_zero() || value > MAX_TIMEOUT {
                return fail(field, format!("is {value:?}; it must be more than zero and at most {MAX_TIMEOUT:?}"));
            }
        }
        if self.max_wait >= self.request_timeout {
            return fail(
                "max_wait",
                format!(
                    "is {:?}; it must be less than request_timeout ({:?}), or merged requests would time out",
                    self.max_wait, self.request_timeout
                ),
            );
        }
        Ok(())
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A [`Config`] field has a value the service cannot use.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The model could not be loaded (the error names the file, and the tensor at fault).
    #[error(transparent)]
    Model(#[from] opsmith::autograd::Error),
    /// A worker could not start: its thread, or its CUDA stream.
    #[error("could not start worker {worker}: {reason}")]
    Worker {
        /// Which worker.
        worker: usize,
        /// What failed.
        reason: String,
    },
}

/// The model as served: an [`Mlp`] loaded without a tape (its weights are constants).
pub struct Model {
    mlp: Mlp,
}

impl Model {
    /// Loads a file written by `train_mlp` (`Mlp::save_safetensors`) onto `device`. The file is
    /// checked whole here (see `Mlp::from_safetensors`): a missing, misnamed, misshapen or
    /// non-finite tensor, mixed dtypes, or f64 weights bound for CUDA are a
    /// [`StartError::Model`] naming the tensor, not a service that fails every request.
    ///
    /// ```
    /// use opsmith_example_serve::Model;
    /// assert!(Model::load("no/such/mlp.safetensors", opsmith::Device::Cpu).is_err());
    /// ```
    pub fn load(path: impl AsRef<Path>, device: Device) -> Result<Model, StartError> {
        Ok(Model { mlp: Mlp::load_safetensors(path, device, None)? })
    }

    /// Serves an MLP already in memory.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use opsmith::autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith::{DType, Device};
    /// use opsmith_example_serve::Model;
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 1)?;
    /// let model = Model::from_mlp(mlp);
    /// assert_eq!((model.features(), model.classes()), (2, 3));
    /// # Ok(()) }
    /// ```
    pub fn from_mlp(mlp: Mlp) -> Model {
        Model { mlp }
    }

    /// Input features per row.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use opsmith::autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith::{DType, Device};
    /// use opsmith_example_serve::Model;
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 1)?;
    /// let model = Model::from_mlp(mlp);
    /// assert_eq!(model.features(), 2);
    /// # Ok(()) }
    /// ```
    pub fn features(&self) -> usize {
        self.mlp.sizes()[0]
    }

    /// Output classes per row.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use opsmith::autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith::{DType, Device};
    /// use opsmith_example_serve::Model;
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 1)?;
    /// let model = Model::from_mlp(mlp);
    /// assert_eq!(model.classes(), 3);
    /// # Ok(()) }
    /// ```
    pub fn classes(&self) -> usize {
        self.mlp.sizes().last().copied().unwrap_or(0)
    }

    /// Class probabilities for `rows` rows of features, row-major: softmax of the logits, on
    /// the model's device and the calling thread's current stream.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use opsmith::autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith::{DType, Device};
    /// use opsmith_example_serve::Model;
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 1)?;
    /// let model = Model::from_mlp(mlp);
    /// let p = model.predict(&[0.5, -1.0, 2.0, 0.25], 2)?; // two rows
    /// assert_eq!(p.len(), 6);
    /// assert!((p[0] + p[1] + p[2] - 1.0).abs() < 1e-6);
    /// # Ok(()) }
    /// ```
    pub fn predict(&self, inputs: &[f32], rows: usize) -> opsmith::autograd::Result<Vec<f32>> {
        let _inference = no_grad();
        let dtype = self.mlp.layers()[0].weight().value().dtype();
        let values: Vec<f64> = inputs.iter().map(|&v| f64::from(v)).collect();
        let x = Tensor::from_f64(&values, [rows, self.features()], dtype, self.mlp.device())?;
        let logits = self.mlp.forward(&Var::constant(x))?;
        let probabilities = ops::softmax(logits.value(), 1.0, None)?;
        Ok(probabilities.to_vec_f64()?.into_iter().map(|v| v as f32).collect())
    }
}

/// One request waiting for a worker.
struct Job {
    inputs: Vec<f32>,
    rows: usize,
    reply: oneshot::Sender<Result<Vec<f32>, String>>,
}

/// How a worker computes a batch: [`Model::predict`], or a stand-in that fails on purpose in tests.
type PredictFn = dyn Fn(&Model, &[f32], usize) -> opsmith::autograd::Result<Vec<f32>> + Send + Sync;

/// The workers as `/healthz` reports them.
struct Workers {
    configured: usize,
    alive: AtomicUsize,
    /// Panics caught in inference (each failed only its own requests).
    panics: AtomicU64,
    /// How the last worker to stop stopped.
    last_exit: Mutex<Option<String>>,
    /// Where the workers record the batches they run and the requests they take off the queue.
    metrics: Arc<Metrics>,
}

/// Counts its worker among the living until the thread ends, however it ends (a panic unwinds
/// through it too).
struct Alive {
    workers: Arc<Workers>,
    index: usize,
}

impl Alive {
    fn new(workers: Arc<Workers>, index: usize) -> Alive {
        workers.alive.fetch_add(1, Ordering::SeqCst);
        Alive { workers, index }
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        let how = if std::thread::panicking() {
            tracing::error!(worker = self.index, "worker panicked");
            "panicked"
        } else {
            tracing::debug!(worker = self.index, "worker stopped");
            "stopped"
        };
        *self.workers.last_exit.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(format!("worker {} {how}", self.index));
        self.workers.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

struct AppState {
    model: Arc<Model>,
    config: Config,
    queue: SyncSender<Job>,
    workers: Arc<Workers>,
}

/// The request body of `POST /v1/predict`.
#[derive(Debug, Deserialize, Serialize)]
pub struct PredictRequest {
    /// One row of features per prediction.
    pub inputs: Vec<Vec<f32>>,
}

/// One prediction.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
pub struct Prediction {
    /// The most probable class.
    pub class: usize,
    /// The probability of each class.
    pub probabilities: Vec<f32>,
}

/// The response body of `POST /v1/predict`.
#[derive(Debug, Deserialize, Serialize)]
pub struct PredictResponse {
    /// One prediction per input row, in order.
    pub outputs: Vec<Prediction>,
}

/// The body of every error answer.
#[derive(Debug, Deserialize, Serialize)]
pub struct ErrorBody {
    /// What was wrong.
    pub error: String,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: message.into() })).into_response()
}

/// Validates `config`, starts `config.workers` worker threads for `model` and returns the router
/// that feeds them, with the body and request timeouts (the connection limits need [`Server`]).
/// The workers stop when the router (and every clone of it) is dropped.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use opsmith::autograd::{Tape, nn::{Activation, Mlp}};
/// use opsmith::{DType, Device};
/// use opsmith_example_serve::{Config, Model, StartError, router};
/// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 1)?;
/// let model = std::sync::Arc::new(Model::from_mlp(mlp));
/// let app = router(model.clone(), Config::default())?; // an axum Router
/// # drop(app);
/// let bad = router(model, Config { workers: 0, ..Config::default() });
/// assert!(matches!(bad, Err(StartError::Config(e)) if e.field == "workers"));
/// # Ok(()) }
/// ```
pub fn router(model: Arc<Model>, config: Config) -> Result<Router, StartError> {
    app(model, config, Arc::new(|model: &Model, inputs: &[f32], rows| model.predict(inputs, rows)))
}

fn app(model: Arc<Model>, config: Config, predict_fn: Arc<PredictFn>) -> Result<Router, StartError> {
    config.validate()?;
    let (queue, jobs) = sync_channel::<Job>(config.queue_capacity);
    let jobs = Arc::new(Mutex::new(jobs));
    let workers = Arc::new(Workers {
        configured: config.workers,
        alive: AtomicUsize::new(0),
        panics: AtomicU64::new(0),
        last_exit: Mutex::new(None),
        metrics: Arc::new(Metrics::default()),
    });
    for worker in 0..config.workers {
        let (model, jobs, config, predict_fn, health) =
            (model.clone(), jobs.clone(), config.clone(), predict_fn.clone(), workers.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!("opsmith-worker-{worker}"))
            .spawn(move || run_worker(&model, &*predict_fn, &jobs, &config, health, worker, ready_tx))
            .map_err(|e| StartError::Worker { worker, reason: e.to_string() })?;
        ready_rx
            .recv()
            .map_err(|_| StartError::Worker { worker, reason: "it stopped while starting".into() })?
            .map_err(|reason| StartError::Worker { worker, reason })?;
    }
    let (body_limit, request_timeout) = (config.max_body_bytes, config.request_timeout);
    let metrics = workers.metrics.clone();
    let state = Arc::new(AppState { model, config, queue, workers });
    Ok(Router::new()
        .route("/v1/predict", post(predict))
        .route("/healthz", get(healthz))
        .route("/metrics", get(render_metrics))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(request_timeout, request_deadline))
        // Outermost: it sees every answer, the request timeout's 503s and the 404s included.
        .layer(middleware::from_fn_with_state(metrics, observe))
        .with_state(state))
}

/// The route label of a request: one of the service's routes, or "other" (any path a client
/// makes up must not become a new time series).
fn route_of(path: &str) -> &'static str {
    match path {
        "/v1/predict" => "/v1/predict",
        "/healthz" => "/healthz",
        "/metrics" => "/metrics",
        _ => "other",
    }
}

/// Counts and times each answer, and logs it: at `debug`, or `warn` for a 5xx.
async fn observe(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let (method, route) = (request.method().clone(), route_of(request.uri().path()));
    let response = next.run(request).await;
    let (status, took) = (response.status(), started.elapsed());
    metrics.request(route, status.as_u16(), took);
    if status.is_server_error() {
        tracing::warn!(%method, route, status = status.as_u16(), seconds = took.as_secs_f64(), "request failed");
    } else {
        tracing::debug!(%method, route, status = status.as_u16(), seconds = took.as_secs_f64(), "request");
    }
    response
}

async fn render_metrics(State(state): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], state.workers.metrics.render()).into_response()
}

/// A worker: its own stream on CUDA; takes a request, merges what else arrives within
/// `max_wait`, runs the batch, answers each request with its rows.
fn run_worker(
    model: &Model,
    predict: &PredictFn,
    jobs: &Mutex<Receiver<Job>>,
    config: &Config,
    workers: Arc<Workers>,
    index: usize,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let stream = match model.mlp.device() {
        Device::Cuda(n) => match opsmith::cuda::CudaDevice::get(n).and_then(|d| d.new_stream()) {
            Ok(s) => Some(s),
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        },
        Device::Cpu => None,
    };
    let _on_own_stream = stream.as_ref().map(|s| s.make_current());
    let _alive = Alive::new(workers.clone(), index);
    let _ = ready.send(Ok(()));
    // A request that did not fit the last batch: it starts the next one.
    let mut carried = None;
    loop {
        // Only the receiver is used under the lock, and it has no invariant a panic could break,
        // so a poisoned lock is still sound to use. The lock is released before inference:
        // inference never runs under it.
        let batch = match carried.take() {
            // A request that did not fit the last batch has had its turn: it merges what is
            // queued if the receiver is free, and otherwise runs alone at once. Waiting for the
            // lock could wait forever: another worker holds it while it blocks for a new request.
            Some(first) => match jobs.try_lock() {
                Ok(jobs) => collect_into(&jobs, first, config, &mut carried, &workers.metrics),
                Err(TryLockError::Poisoned(poisoned)) => {
                    collect_into(&poisoned.into_inner(), first, config, &mut carried, &workers.metrics)
                }
                Err(TryLockError::WouldBlock) => vec![first],
            },
            None => {
                let jobs = jobs.lock().unwrap_or_else(PoisonError::into_inner);
                match jobs.recv() {
                    Ok(first) => {
                        workers.metrics.queue_changed(-1);
                        collect_into(&jobs, first, config, &mut carried, &workers.metrics)
                    }
                    Err(_) => return, // the router is gone
                }
            }
        };
        run_batch(model, predict, batch, &workers);
    }
}

/// [`collect`], with the request that did not fit put in `carried`.
fn collect_into(
    jobs: &Receiver<Job>,
    first: Job,
    config: &Config,
    carried: &mut Option<Job>,
    metrics: &Metrics,
) -> Vec<Job> {
    let (batch, rest) = collect(jobs, first, config, metrics);
    *carried = rest;
    batch
}

/// `first` and what else arrives within `max_wait`, up to `max_merged_rows` rows; a request
/// that would overflow the batch comes back apart, to start the next one.
fn collect(jobs: &Receiver<Job>, first: Job, config: &Config, metrics: &Metrics) -> (Vec<Job>, Option<Job>) {
    // Config::validate bounds max_wait; if the clock could not add it, don't wait at all.
    let deadline = Instant::now().checked_add(config.max_wait).unwrap_or_else(Instant::now);
    let mut rows = first.rows;
    let mut batch = vec![first];
    while rows < config.max_merged_rows {
        let next = jobs.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        if next.is_ok() {
            metrics.queue_changed(-1);
        }
        match next {
            Ok(job) if rows + job.rows <= config.max_merged_rows => {
                rows += job.rows;
                batch.push(job);
            }
            Ok(job) => return (batch, Some(job)),
            Err(_) => break, // the deadline passed, or the router is gone
        }
    }
    (batch, None)
}

/// Runs a batch and answers each request with its rows. When a merged batch fails, each of its
/// requests runs again alone, so that one bad request cannot fail the others.
fn run_batch(model: &Model, predict: &PredictFn, mut batch: Vec<Job>, workers: &Workers) {
    // A client that has given up (timed out, hung up) needs no answer.
    batch.retain(|job| !job.reply.is_closed());
    if batch.is_empty() {
        return;
    }
    match infer(model, predict, &batch, workers) {
        Ok(probabilities) => {
            // infer checked the length: each request takes its rows in order.
            let mut rest = probabilities.as_slice();
            for job in batch {
                let (mine, others) = rest.split_at((job.rows * model.classes()).min(rest.len()));
                let _ = job.reply.send(Ok(mine.to_vec()));
                rest = others;
            }
        }
        Err(message) if batch.len() == 1 => {
            if let Some(job) = batch.pop() {
                let _ = job.reply.send(Err(message));
            }
        }
        Err(_) => {
            for job in batch {
                let result = infer(model, predict, std::slice::from_ref(&job), workers);
                let _ = job.reply.send(result);
            }
        }
    }
}

/// The probabilities for `jobs`' rows, or why there are none. A panic is caught here and
/// becomes this batch's error: the model is only read during inference, so a panic leaves
/// nothing half-updated for the next batch (which is what `AssertUnwindSafe` asserts).
fn infer(model: &Model, predict: &PredictFn, jobs: &[Job], workers: &Workers) -> Result<Vec<f32>, String> {
    let rows: usize = jobs.iter().map(|j| j.rows).sum();
    let inputs: Vec<f32> = jobs.iter().flat_map(|j| j.inputs.iter().copied()).collect();
    let expected = rows * model.classes();
    workers.metrics.batch(rows, jobs.len());
    match catch_unwind(AssertUnwindSafe(|| predict(model, &inputs, rows))) {
        Ok(Ok(probabilities)) if probabilities.len() == expected => Ok(probabilities),
        Ok(Ok(probabilities)) => {
            let message =
                format!("inference returned {} values for {rows} rows; expected {expected}", probabilities.len());
            tracing::error!(rows, requests = jobs.len(), "{message}");
            Err(message)
        }
        Ok(Err(e)) => {
            tracing::error!(rows, requests = jobs.len(), error = %e, "inference failed");
            Err(format!("inference failed: {e}"))
        }
        Err(payload) => {
            workers.panics.fetch_add(1, Ordering::Relaxed);
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            tracing::error!(rows, requests = jobs.len(), message, "inference panicked");
            Err(format!("inference panicked: {message}"))
        }
    }
}

/// Answers 503 for a request that takes longer than `timeout` from its headers to its answer.
async fn request_deadline(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no answer within the request timeout ({timeout:?}); retry later"),
        ),
    }
}

async fn predict(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let body_timeout = state.config.body_timeout;
    let body = match tokio::time::timeout(body_timeout, Json::<PredictRequest>::from_request(request, &())).await {
        Ok(body) => body,
        Err(_) => {
            let mut response = error(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within the body timeout ({body_timeout:?})"),
            );
            // The rest of the body may still come; don't read it, close.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
    };
    let request = match body {
        Ok(Json(request)) => request,
        Err(rejection) => {
            let status = match rejection {
                JsonRejection::JsonSyntaxError(_) | JsonRejection::JsonDataError(_) => StatusCode::BAD_REQUEST,
                ref other => other.status(),
            };
            return error(status, format!("malformed request: {}", rejection.body_text()));
        }
    };
    let (features, rows) = (state.model.features(), request.inputs.len());
    if rows == 0 {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "`inputs` is empty: send at least one row");
    }
    if rows > state.config.max_request_rows {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{rows} rows in one request; the limit is {}", state.config.max_request_rows),
        );
    }
    if let Some((i, row)) = request.inputs.iter().enumerate().find(|(_, r)| r.len() != features) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("row {i} has {} features; the model takes {features}", row.len()),
        );
    }
    // JSON has no NaN or infinity, but a number beyond f32's range (1e39) parses as one.
    if let Some(i) = request.inputs.iter().position(|r| r.iter().any(|v| !v.is_finite())) {
        return error(StatusCode::UNPROCESSABLE_ENTITY, format!("row {i} has a value that is not a finite f32"));
    }
    let (reply, answer) = oneshot::channel();
    let job = Job { inputs: request.inputs.into_iter().flatten().collect(), rows, reply };
    // Counted before the send: a worker may take the job (and count it out) before try_send returns.
    let metrics = &state.workers.metrics;
    metrics.queue_changed(1);
    match state.queue.try_send(job) {
        Ok(()) => tracing::debug!(rows, "request queued"),
        Err(TrySendError::Full(_)) => {
            metrics.queue_changed(-1);
            tracing::warn!(capacity = state.config.queue_capacity, "the queue is full; answering 503");
            return error(StatusCode::SERVICE_UNAVAILABLE, "the queue is full; retry later");
        }
        Err(TrySendError::Disconnected(_)) => {
            metrics.queue_changed(-1);
            return error(StatusCode::SERVICE_UNAVAILABLE, "the workers have stopped");
        }
    }
    match answer.await {
        Ok(Ok(probabilities)) => {
            let classes = state.model.classes().max(1);
            // Finite inputs near ±3.4e38 can overflow f32 inside the model: refuse the row rather
            // than answer 200 with null probabilities.
            if let Some(row) = probabilities.chunks(classes).position(|p| p.iter().any(|v| !v.is_finite())) {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!(
                        "row {row}: the model's output is not finite (the values overflow f32 inside the model); \
                         send smaller values"
                    ),
                );
            }
            let outputs = probabilities
                .chunks(classes)
                .map(|p| Prediction {
                    class: p.iter().enumerate().fold(0, |best, (i, v)| if *v > p[best] { i } else { best }),
                    probabilities: p.to_vec(),
                })
                .collect();
            Json(PredictResponse { outputs }).into_response()
        }
        Ok(Err(message)) => error(StatusCode::INTERNAL_SERVER_ERROR, message),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the worker dropped the request"),
    }
}

async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    let workers = &state.workers;
    let alive = workers.alive.load(Ordering::SeqCst);
    let (code, status) = match alive {
        _ if alive >= workers.configured => (StatusCode::OK, "ok"),
        0 => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        _ => (StatusCode::OK, "degraded"),
    };
    let mut body = serde_json::json!({
        "status": status,
        "device": state.model.mlp.device().to_string(),
        "sizes": state.model.mlp.sizes(),
        "activation": state.model.mlp.activation().name(),
        "workers": workers.configured,
        "workers_alive": alive,
        "inference_panics": workers.panics.load(Ordering::Relaxed),
    });
    if alive < workers.configured {
        let last = workers.last_exit.lock().unwrap_or_else(PoisonError::into_inner).clone();
        body["reason"] = format!(
            "{} of {} workers have stopped (last: {})",
            workers.configured - alive,
            workers.configured,
            last.as_deref().unwrap_or("unknown")
        )
        .into();
    }
    (code, Json(body)).into_response()
}

/// The service on its own listener, with the connection limits a bare [`router`] cannot enforce:
/// at most [`Config::max_connections`] open connections, [`Config::header_timeout`] and
/// [`Config::send_timeout`]. HTTP/1.1 only.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use opsmith_example_serve::{Config, Model, Server};
/// let model = std::sync::Arc::new(Model::load("target/mlp.safetensors", opsmith::Device::cuda_if_available())?);
/// let server = Server::new(model, Config::default())?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// server.serve_until(listener, async { let _ = tokio::signal::ctrl_c().await; }).await;
/// # Ok(()) }
/// ```
pub struct Server {
    router: Router,
    config: Config,
}

impl Server {
    /// Validates `config` and starts the workers (as [`router`] does).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use opsmith::autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith::{DType, Device};
    /// use opsmith_example_serve::{Config, Model, Server, StartError};
    /// use std::time::Duration;
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 1)?;
    /// let model = std::sync::Arc::new(Model::from_mlp(mlp));
    /// let bad = Server::new(model.clone(), Config { header_timeout: Duration::ZERO, ..Config::default() });
    /// assert!(matches!(bad, Err(StartError::Config(e)) if e.field == "header_timeout"));
    /// let server = Server::new(model, Config::default())?;
    /// # drop(server);
    /// # Ok(()) }
    /// ```
    pub fn new(model: Arc<Model>, config: Config) -> Result<Server, StartError> {
        Ok(Server { router: router(model, config.clone())?, config })
    }

    /// The router, to mount in another axum app (without the connection limits).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use opsmith::autograd::{Tape, nn::{Activation, Mlp}};
    /// use opsmith::{DType, Device};
    /// use opsmith_example_serve::{Config, Model, Server};
    /// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 1)?;
    /// let server = Server::new(std::sync::Arc::new(Model::from_mlp(mlp)), Config::default())?;
    /// let app = axum::Router::new().nest("/mlp", server.router());
    /// # drop(app);
    /// # Ok(()) }
    /// ```
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// Serves connections from `listener` until the task is dropped.
    pub async fn serve(self, listener: TcpListener) {
        self.serve_until(listener, std::future::pending()).await
    }

    /// Serves connections from `listener` until `shutdown` completes; then stops accepting, lets
    /// each open connection finish the request it is on (idle ones close at once), and returns
    /// when they have, or after `request_timeout + send_timeout` at most.
    pub async fn serve_until(self, listener: TcpListener, shutdown: impl Future<Output = ()> + Send) {
        let Server { router, config } = self;
        let permits = Arc::new(Semaphore::new(config.max_connections));
        let (stop, stopped) = watch::channel(());
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(config.header_timeout);
        let mut shutdown = pin!(shutdown);
        loop {
            // A free slot first: over the cap, clients wait in the listen backlog.
            let permit = tokio::select! {
                permit = permits.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break, // never closed
                },
                () = &mut shutdown => break,
            };
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors, a connection reset while queued, ...: pause
                        // rather than spin, then try again.
                        tracing::warn!(error = %e, "accepting a connection failed; retrying in 50 ms");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let io = TokioIo::new(SendTimeout::new(stream, config.send_timeout));
            let connection = http.serve_connection(io, TowerToHyperService::new(router.clone()));
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let mut connection = pin!(connection);
                tokio::select! {
                    // Errors here are the client's (a timeout, a reset): nothing to answer.
                    result = connection.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(error = %e, "connection closed with an error");
                        }
                        return;
                    }
                    _ = stopped.changed() => {}
                }
                connection.as_mut().graceful_shutdown();
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "connection closed with an error while shutting down");
                }
            });
        }
        drop(stop);
        let open = config.max_connections.saturating_sub(permits.available_permits());
        tracing::info!(open_connections = open, "shutting down: no new connections; letting open ones finish");
        let all = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
        let limit = config.request_timeout + config.send_timeout;
        match tokio::time::timeout(limit, permits.acquire_many(all)).await {
            Ok(_) => tracing::info!("every connection has closed"),
            Err(_) => tracing::warn!(
                open_connections = config.max_connections.saturating_sub(permits.available_permits()),
                "connections still open after {limit:?}; leaving them"
            ),
        }
    }
}

/// A connection whose writes fail once they have made no progress for `timeout`: a client that
/// stops reading its answer cannot hold the connection (and its slot) forever.
struct SendTimeout<T> {
    io: T,
    timeout: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> SendTimeout<T> {
    fn new(io: T, timeout: Duration) -> SendTimeout<T> {
        SendTimeout { io, timeout, stalled: None }
    }

    /// Passes on a write's result; while it is pending, an error once it has been for `timeout`.
    fn watch<R>(&mut self, cx: &mut Context<'_>, result: Poll<std::io::Result<R>>) -> Poll<std::io::Result<R>> {
        if result.is_ready() {
            self.stalled = None;
            return result;
        }
        let timeout = self.timeout;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client took none of the answer for {timeout:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, result)
    }
}
