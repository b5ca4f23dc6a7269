//! An HTTP inference service that embeds opsmith: it serves the MLP that the `train_mlp`
//! example writes, batching concurrent requests onto worker threads that each own a CUDA stream
//! (or run on the CPU when there is no GPU).
//!
//! * `POST /v1/predict` takes `{"inputs": [[f32; features], ...]}` and answers
//!   `{"outputs": [{"class": k, "probabilities": [...]}, ...]}`, one output per input row.
//! * `GET /healthz` answers `{"status": "ok", "device": ..., "sizes": [...], ...}`.
//!
//! Bad requests get a 4xx and a JSON `{"error": "..."}` that says what is wrong: malformed JSON
//! (400), a body that is not JSON (415), a wrong feature count or an empty batch (422), too many
//! rows or too large a body (413). When the queue is full the answer is 503; nothing a client
//! sends can stop the server.
//!
//! Requests are merged: a worker takes the first waiting request, then whatever else arrives
//! within [`Config::max_wait`], up to [`Config::max_merged_rows`] rows, runs them as one batch
//! (one GEMM per layer instead of one per request) and splits the answer.
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use opsmith::autograd::nn::Mlp;
use opsmith::autograd::{Var, no_grad};
use opsmith::{Device, Tensor, ops};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The service's limits and batching.
#[derive(Clone, Debug)]
pub struct Config {
    /// Worker threads, each with its own CUDA stream.
    pub workers: usize,
    /// The most rows one request may carry (more is a 413).
    pub max_request_rows: usize,
    /// The most rows a worker merges into one batch.
    pub max_merged_rows: usize,
    /// How long a worker waits for more requests after the first before it runs the batch.
    pub max_wait: Duration,
    /// Requests waiting beyond this many get a 503.
    pub queue_capacity: usize,
    /// The largest request body accepted (more is a 413).
    pub max_body_bytes: usize,
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
        }
    }
}

/// Why the service could not start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// The model as served: an [`Mlp`] loaded without a tape (its weights are constants).
pub struct Model {
    mlp: Mlp,
}

impl Model {
    /// Loads a file written by `train_mlp` (`Mlp::save_safetensors`) onto `device`.
    ///
    /// ```
    /// use opsmith_example_serve::Model;
    /// assert!(Model::load("no/such/mlp.safetensors", opsmith::Device::Cpu).is_err());
    /// ```
    pub fn load(path: impl AsRef<Path>, device: Device) -> Result<Model, StartError> {
        let mlp = Mlp::load_safetensors(path, device, None).map_err(|e| StartError(e.to_string()))?;
        Ok(Model { mlp })
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

struct AppState {
    model: Arc<Model>,
    config: Config,
    queue: SyncSender<Job>,
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

/// Starts `config.workers` worker threads for `model` and returns the router that feeds them.
/// The workers stop when the router (and every clone of it) is dropped.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use opsmith::autograd::{Tape, nn::{Activation, Mlp}};
/// use opsmith::{DType, Device};
/// use opsmith_example_serve::Model;
/// let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 1)?;
/// let model = Model::from_mlp(mlp);
/// use opsmith_example_serve::{Config, router};
/// let app = router(std::sync::Arc::new(model), Config::default())?; // an axum Router
/// # drop(app);
/// # Ok(()) }
/// ```
pub fn router(model: Arc<Model>, config: Config) -> Result<Router, StartError> {
    if config.workers == 0 || config.max_request_rows == 0 || config.max_merged_rows < config.max_request_rows {
        return Err(StartError(format!(
            "bad config: need workers > 0 and 0 < max_request_rows <= max_merged_rows, got {config:?}"
        )));
    }
    let (queue, jobs) = sync_channel::<Job>(config.queue_capacity);
    let jobs = Arc::new(Mutex::new(jobs));
    for worker in 0..config.workers {
        let (model, jobs, config) = (model.clone(), jobs.clone(), config.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!("opsmith-worker-{worker}"))
            .spawn(move || run_worker(&model, &jobs, &config, ready_tx))
            .map_err(|e| StartError(format!("could not start worker {worker}: {e}")))?;
        ready_rx
            .recv()
            .map_err(|_| StartError(format!("worker {worker} stopped while starting")))?
            .map_err(|e| StartError(format!("worker {worker}: {e}")))?;
    }
    let body_limit = config.max_body_bytes;
    let state = Arc::new(AppState { model, config, queue });
    Ok(Router::new()
        .route("/v1/predict", post(predict))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state))
}

/// A worker: its own stream on CUDA; takes a request, merges what else arrives within
/// `max_wait`, runs the batch, answers each request with its rows.
fn run_worker(
    model: &Model,
    jobs: &Mutex<Receiver<Job>>,
    config: &Config,
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
    let _ = ready.send(Ok(()));
    loop {
        let batch = {
            let Ok(jobs) = jobs.lock() else { return };
            let Ok(first) = jobs.recv() else { return }; // the router is gone
            let deadline = Instant::now() + config.max_wait;
            let mut rows = first.rows;
            let mut batch = vec![first];
            while rows < config.max_merged_rows {
                match jobs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(job) if rows + job.rows <= config.max_merged_rows => {
                        rows += job.rows;
                        batch.push(job);
                    }
                    Ok(job) => {
                        // Doesn't fit: run it alone right after this batch.
                        run_batch(model, vec![job]);
                        break;
                    }
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            batch
        };
        run_batch(model, batch);
    }
}

fn run_batch(model: &Model, batch: Vec<Job>) {
    let rows: usize = batch.iter().map(|j| j.rows).sum();
    let inputs: Vec<f32> = batch.iter().flat_map(|j| j.inputs.iter().copied()).collect();
    match model.predict(&inputs, rows) {
        Ok(probabilities) => {
            let classes = model.classes();
            let mut start = 0;
            for job in batch {
                let end = start + job.rows * classes;
                let _ = job.reply.send(Ok(probabilities[start..end].to_vec()));
                start = end;
            }
        }
        Err(e) => {
            for job in batch {
                let _ = job.reply.send(Err(e.to_string()));
            }
        }
    }
}

async fn predict(State(state): State<Arc<AppState>>, body: Result<Json<PredictRequest>, JsonRejection>) -> Response {
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
    if let Some(i) = request.inputs.iter().position(|r| r.iter().any(|v| !v.is_finite())) {
        return error(StatusCode::UNPROCESSABLE_ENTITY, format!("row {i} has a value that is not a finite f32"));
    }
    let (reply, answer) = oneshot::channel();
    let job = Job { inputs: request.inputs.into_iter().flatten().collect(), rows, reply };
    match state.queue.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => return error(StatusCode::SERVICE_UNAVAILABLE, "the queue is full; retry later"),
        Err(TrySendError::Disconnected(_)) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, "the workers have stopped");
        }
    }
    match answer.await {
        Ok(Ok(probabilities)) => {
            let outputs = probabilities
                .chunks(state.model.classes().max(1))
                .map(|p| Prediction {
                    class: p.iter().enumerate().fold(0, |best, (i, v)| if *v > p[best] { i } else { best }),
                    probabilities: p.to_vec(),
                })
                .collect();
            Json(PredictResponse { outputs }).into_response()
        }
        Ok(Err(message)) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("inference failed: {message}")),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the worker dropped the request"),
    }
}

async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    Json(serde_json::json!({
        "status": "ok",
        "device": state.model.mlp.device().to_string(),
        "sizes": state.model.mlp.sizes(),
        "activation": state.model.mlp.activation().name(),
        "workers": state.config.workers,
    }))
    .into_response()
}
