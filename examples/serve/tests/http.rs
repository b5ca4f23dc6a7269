//! Starts the service on a loopback port and sends it real HTTP requests: 1,000 concurrent
//! ones, every tenth of them bad, each answer checked against an f64 forward pass of the same
//! weights; then each kind of bad request alone, and a good one after them; then slow and
//! stuck clients over raw TCP, more connections than the cap, bad configurations, rows that
//! overflow f32 and bad model files; `/metrics` after known requests, the command line, and a
//! graceful stop with a request in flight. (tests/process.rs runs the binary itself.)
use opsmith::autograd::Tape;
use opsmith::autograd::nn::{Activation, Linear, Mlp};
use opsmith::{DType, Device, Tensor};
use opsmith_example_serve::cli::{Args, LogFormat, LogLevel};
use opsmith_example_serve::{Config, ErrorBody, Model, PredictResponse, Server, StartError, router};
use reqwest::StatusCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SIZES: [usize; 3] = [2, 16, 3];

/// Probabilities for one row, computed in f64 from the weights.
fn reference(weights: &[(Vec<f64>, Vec<f64>)], row: &[f32]) -> Vec<f64> {
    let mut h: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
    for (layer, (w, b)) in weights.iter().enumerate() {
        let out = b.len();
        let mut next: Vec<f64> = b.clone();
        for (i, x) in h.iter().enumerate() {
            for j in 0..out {
                next[j] += x * w[i * out + j];
            }
        }
        if layer + 1 < weights.len() {
            next.iter_mut().for_each(|v| *v = v.max(0.0));
        }
        h = next;
    }
    let max = h.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = h.iter().map(|v| (v - max).exp()).collect();
    let total: f64 = exp.iter().sum();
    exp.iter().map(|e| e / total).collect()
}

fn row(i: usize, r: usize) -> Vec<f32> {
    vec![((i * 7 + r * 3) % 23) as f32 / 11.5 - 1.0, ((i * 5 + r) % 19) as f32 / 9.5 - 1.0]
}

async fn start(config: Config) -> (String, Vec<(Vec<f64>, Vec<f64>)>) {
    let device = Device::cuda_if_available();
    let mlp = Mlp::new(&Tape::new(), &SIZES, Activation::Relu, DType::F32, device, 9).unwrap();
    // One file per server: the tests run in parallel, and one must not read another's half-written file.
    static SERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let server = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("opsmith-serve-test-{}-{server}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.safetensors");
    mlp.save_safetensors(&path).unwrap();
    let weights = mlp
        .layers()
        .iter()
        .map(|l| (l.weight().value().to_vec_f64().unwrap(), l.bias().value().to_vec_f64().unwrap()))
        .collect();
    let model = Model::load(&path, device).unwrap();
    (serve(model, config).await, weights)
}

/// Serves `model` on a free loopback port; returns its base URL.
async fn serve(model: Model, config: Config) -> String {
    let server = Server::new(Arc::new(model), config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server.serve(listener));
    format!("http://{addr}")
}

fn check(outputs: &PredictResponse, weights: &[(Vec<f64>, Vec<f64>)], rows: &[Vec<f32>]) {
    assert_eq!(outputs.outputs.len(), rows.len());
    for (out, row) in outputs.outputs.iter().zip(rows) {
        let expected = reference(weights, row);
        for (got, want) in out.probabilities.iter().zip(&expected) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{row:?}: {:?} vs {expected:?}", out.probabilities);
        }
        let best = expected.iter().enumerate().fold(0, |b, (i, v)| if *v > expected[b] { i } else { b });
        // A near tie may go either way in f32.
        assert!(out.class == best || (expected[out.class] - expected[best]).abs() < 1e-5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_requests_with_bad_ones_among_them() {
    let config = Config { max_request_rows: 64, ..Config::default() };
    let (base, weights) = start(config).await;
    let weights = Arc::new(weights);
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000usize {
        let (client, base, weights) = (client.clone(), base.clone(), weights.clone());
        tasks.spawn(async move {
            let url = format!("{base}/v1/predict");
            if i % 10 == 3 {
                // A row with three features: 422, and the message says why.
                let answer =
                    client.post(&url).json(&serde_json::json!({"inputs": [[1.0, 2.0, 3.0]]})).send().await.unwrap();
                assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
                let body: ErrorBody = answer.json().await.unwrap();
                assert!(body.error.contains("3 features"), "{}", body.error);
                return;
            }
            let rows: Vec<Vec<f32>> = (0..1 + i % 5).map(|r| row(i, r)).collect();
            let answer = client.post(&url).json(&serde_json::json!({ "inputs": rows })).send().await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
            check(&answer.json().await.unwrap(), &weights, &rows);
        });
    }
    let mut done = 0;
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
        done += 1;
    }
    assert_eq!(done, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_4xx_answers_and_the_server_keeps_serving() {
    let config = Config { max_request_rows: 8, max_body_bytes: 64 << 10, ..Config::default() };
    let (base, weights) = start(config).await;
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/predict");
    let json = |body: &'static str| client.post(&url).header("content-type", "application/json").body(body).send();

    let cases: Vec<(reqwest::Response, StatusCode, &str)> = vec![
        (json("{\"inputs\": [[1.0, 2.0]").await.unwrap(), StatusCode::BAD_REQUEST, "malformed"),
        (json("{\"inputs\": \"many\"}").await.unwrap(), StatusCode::BAD_REQUEST, "malformed"),
        (json("{\"rows\": [[1.0, 2.0]]}").await.unwrap(), StatusCode::BAD_REQUEST, "inputs"),
        (
            client.post(&url).body("{\"inputs\": [[1.0, 2.0]]}").send().await.unwrap(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
        ),
        (json("{\"inputs\": []}").await.unwrap(), StatusCode::UNPROCESSABLE_ENTITY, "empty"),
        (json("{\"inputs\": [[1.0]]}").await.unwrap(), StatusCode::UNPROCESSABLE_ENTITY, "1 features"),
        (json("{\"inputs\": [[1.0, 2.0], [1.0, 2.0, 3.0]]}").await.unwrap(), StatusCode::UNPROCESSABLE_ENTITY, "row 1"),
        (
            client.post(&url).json(&serde_json::json!({"inputs": vec![[0.5f32, 0.5]; 9]})).send().await.unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "9 rows",
        ),
        (json("{\"inputs\": [[1e39, 2.0]]}").await.unwrap(), StatusCode::UNPROCESSABLE_ENTITY, "finite"),
    ];
    for (i, (answer, status, needle)) in cases.into_iter().enumerate() {
        assert_eq!(answer.status(), status, "case {i}");
        let body: ErrorBody = answer.json().await.unwrap_or_else(|e| panic!("case {i}: error body is JSON: {e}"));
        assert!(body.error.contains(needle), "case {i}: {:?} lacks {needle:?}", body.error);
    }
    // A body over the limit is refused before it is parsed.
    let huge = format!("{{\"inputs\": [[{}]]}}", vec!["1.0"; 40_000].join(","));
    let answer = client.post(&url).header("content-type", "application/json").body(huge).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(client.get(&url).send().await.unwrap().status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(client.get(format!("{base}/v2/predict")).send().await.unwrap().status(), StatusCode::NOT_FOUND);

    // Still serving, and right.
    let rows = vec![row(1, 0), row(2, 1)];
    let answer = client.post(&url).json(&serde_json::json!({ "inputs": rows })).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    check(&answer.json().await.unwrap(), &weights, &rows);

    let health = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let health: serde_json::Value = health.json().await.unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["sizes"], serde_json::json!(SIZES));
    assert_eq!((health["workers"].as_u64(), health["workers_alive"].as_u64()), (Some(2), Some(2)));
    assert_eq!(health["inference_panics"], 0);
}

/// Bounds every wait on the server below: a server that never closes fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(5);

/// Reads until the server closes the connection (or resets it); returns what came back and when.
async fn read_until_closed(stream: &mut TcpStream, since: Instant) -> (String, Duration) {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    let read = async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .unwrap_or_else(|_| panic!("the connection is still open after {PATIENCE:?}"));
    (String::from_utf8_lossy(&answer).into_owned(), since.elapsed())
}

/// Opens a connection, sends `bytes` and waits for the server to close it.
async fn send_raw(base: &str, bytes: &str) -> (String, Duration) {
    let mut stream = TcpStream::connect(base.trim_start_matches("http://")).await.unwrap();
    let since = Instant::now();
    stream.write_all(bytes.as_bytes()).await.unwrap();
    read_until_closed(&mut stream, since).await
}

/// One GET on a connection that stays open: reads exactly the answer (by its content-length).
async fn get_keep_alive(stream: &mut TcpStream, path: &str) -> String {
    stream.write_all(format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n").as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !answer.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            answer.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&answer).to_lowercase();
        let length: usize =
            head.lines().find_map(|l| l.strip_prefix("content-length:")).map(|v| v.trim().parse().unwrap()).unwrap();
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.unwrap();
        answer.extend_from_slice(&body);
    };
    tokio::time::timeout(PATIENCE, read).await.unwrap();
    String::from_utf8(answer).unwrap()
}

/// Item 8: half-sent headers, a silent connection and a body that stops short no longer hold a
/// connection open; the service keeps answering everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_and_the_server_keeps_serving() {
    let timeout = Duration::from_millis(400);
    let config = Config { header_timeout: timeout, body_timeout: timeout, ..Config::default() };
    let (base, weights) = start(config).await;
    let predict = "POST /v1/predict HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n";
    let cases = [
        ("half-sent headers", format!("{predict}content-le"), ""),
        ("nothing at all", String::new(), ""),
        ("5 of 1000 body bytes", format!("{predict}content-length: 1000\r\n\r\n{{\"inp"), "HTTP/1.1 408"),
    ];
    // Concurrently: they wait out their timeouts together.
    let (a, b, c) =
        tokio::join!(send_raw(&base, &cases[0].1), send_raw(&base, &cases[1].1), send_raw(&base, &cases[2].1));
    for ((what, _, status), (answer, after)) in cases.iter().zip([a, b, c]) {
        assert!(answer.starts_with(status), "{what}: {answer:?}");
        // Closed by the timeout: not before it, and well before the old 35 s.
        assert!(
            after >= timeout - Duration::from_millis(50) && after < Duration::from_secs(3),
            "{what}: closed after {after:?}"
        );
    }
    let (answer, _) = send_raw(&base, &format!("{predict}content-length: 1000\r\n\r\n{{\"inp")).await;
    assert!(answer.contains("body timeout"), "{answer}");
    // A route that never reads its body answers, then closes rather than wait for the rest.
    let (answer, after) =
        send_raw(&base, "GET /healthz HTTP/1.1\r\nhost: test\r\ncontent-length: 1000\r\n\r\n{\"inp").await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("\"status\":\"ok\""), "{answer}");
    assert!(after < Duration::from_secs(3), "closed after {after:?}");

    // Still serving, and right.
    let rows = vec![row(3, 0)];
    let answer = reqwest::Client::new()
        .post(format!("{base}/v1/predict"))
        .json(&serde_json::json!({ "inputs": rows }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    check(&answer.json().await.unwrap(), &weights, &rows);
}

/// Item 8: a request that takes longer than `request_timeout` from its headers on is answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_request_timeout_gets_503() {
    let timeout = Duration::from_millis(400);
    let config = Config { body_timeout: Duration::from_secs(60), request_timeout: timeout, ..Config::default() };
    let (base, _) = start(config).await;
    let head =
        "POST /v1/predict HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n";
    let (answer, after) = send_raw(&base, &format!("{head}{{\"inp")).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("request timeout"), "{answer}");
    assert!(after >= timeout - Duration::from_millis(50) && after < Duration::from_secs(3), "answered after {after:?}");
}

/// Item 8: with the cap at two connections, two idle keep-alive connections hold a third client
/// back until the header timeout closes them; then it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_wait_for_a_free_slot() {
    let idle = Duration::from_millis(600);
    let config = Config { max_connections: 2, header_timeout: idle, ..Config::default() };
    let (base, _) = start(config).await;
    let addr = base.trim_start_matches("http://").to_string();
    // Two connections, each answered once (so they are surely accepted), then left idle.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        assert!(get_keep_alive(&mut stream, "/healthz").await.starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let since = Instant::now();
    let third = tokio::time::timeout(PATIENCE, reqwest::Client::new().get(format!("{base}/healthz")).send()).await;
    let waited = since.elapsed();
    assert_eq!(third.expect("answered once a slot freed").unwrap().status(), StatusCode::OK);
    assert!(waited >= idle / 2, "the third connection was served after {waited:?}, while two others held both slots");
    // And the idle ones were indeed closed.
    for mut stream in held {
        let (rest, _) = read_until_closed(&mut stream, Instant::now()).await;
        assert_eq!(rest, "");
    }
}

/// Item 8: a client that asks for a large answer and stops reading it loses the connection after
/// `send_timeout`, instead of holding it (and a slot) forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off_after_the_send_timeout() {
    // 2,000 classes and 1,024 rows: an answer of ~25 MB, far more than the socket buffers hold
    // (the client's receive buffer is kept small on purpose).
    let mlp = Mlp::new(&Tape::new(), &[2, 4, 2000], Activation::Relu, DType::F32, Device::Cpu, 5).unwrap();
    let send_timeout = Duration::from_millis(300);
    let base = serve(Model::from_mlp(mlp), Config { send_timeout, ..Config::default() }).await;
    let body = serde_json::json!({ "inputs": vec![[0.5f32, -0.25]; 1024] }).to_string();
    let request = format!(
        "POST /v1/predict HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 << 10).unwrap();
    let mut stream = socket.connect(base.trim_start_matches("http://").parse().unwrap()).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    // The first bytes of the answer (once inference is done), then nothing read for 5 send timeouts.
    let mut head = vec![0u8; 1024];
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut head)).await.unwrap().unwrap();
    tokio::time::sleep(send_timeout * 5).await;
    let (rest, _) = read_until_closed(&mut stream, Instant::now()).await;
    let answer = String::from_utf8_lossy(&head).into_owned() + &rest;
    assert!(answer.starts_with("HTTP/1.1 200"), "{}", &answer[..answer.len().min(200)]);
    let length: usize = answer
        .to_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .unwrap();
    let received = answer.split_once("\r\n\r\n").map(|(_, b)| b.len()).unwrap_or(0);
    assert!(length > 20 << 20, "the answer is only {length} bytes");
    assert!(received < length, "the whole answer ({length} bytes) was kept waiting for the client");
}

/// Item 9: a configuration the service cannot run is an error naming the field, at build time;
/// `max_wait: Duration::MAX` used to make every worker panic on its first request.
#[test]
fn bad_configs_are_errors_naming_the_field() {
    let mlp = Mlp::new(&Tape::new(), &SIZES, Activation::Relu, DType::F32, Device::Cpu, 9).unwrap();
    let model = Arc::new(Model::from_mlp(mlp));
    let d = Config::default;
    let cases = [
        (Config { max_wait: Duration::MAX, ..d() }, "max_wait"),
        (Config { max_wait: Duration::from_secs(30), request_timeout: Duration::from_secs(30), ..d() }, "max_wait"),
        (Config { workers: 0, ..d() }, "workers"),
        (Config { workers: usize::MAX, ..d() }, "workers"),
        (Config { max_request_rows: 0, ..d() }, "max_request_rows"),
        (Config { max_request_rows: 10, max_merged_rows: 9, ..d() }, "max_merged_rows"),
        (Config { queue_capacity: 0, ..d() }, "queue_capacity"),
        (Config { max_body_bytes: 0, ..d() }, "max_body_bytes"),
        (Config { max_connections: 0, ..d() }, "max_connections"),
        (Config { header_timeout: Duration::ZERO, ..d() }, "header_timeout"),
        (Config { body_timeout: Duration::MAX, ..d() }, "body_timeout"),
        (Config { request_timeout: Duration::ZERO, ..d() }, "request_timeout"),
        (Config { send_timeout: Duration::from_secs(1 << 40), ..d() }, "send_timeout"),
    ];
    for (config, field) in cases {
        match router(model.clone(), config.clone()) {
            Err(StartError::Config(e)) => {
                assert_eq!(e.field, field, "{e}");
                assert!(e.to_string().contains(field), "{e}");
            }
            other => panic!("{field}: expected a config error, got {:?}", other.map(|_| "a router")),
        }
        assert!(matches!(Server::new(model.clone(), config), Err(StartError::Config(e)) if e.field == field));
    }
}

/// An MLP with hand-set weights: `h = relu(x0 + x1)` twice, logits `[h0 + h1, -(h0 + h1), (h0 + h1) / 2]`.
fn overflowing_mlp() -> Mlp {
    let t = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape.to_vec(), Device::Cpu).unwrap();
    let first = Linear::from_tensors(t(vec![1.0; 4], &[2, 2]), t(vec![0.0; 2], &[2]), None).unwrap();
    let second =
        Linear::from_tensors(t(vec![1.0, -1.0, 0.5, 1.0, -1.0, 0.5], &[2, 3]), t(vec![0.0; 3], &[3]), None).unwrap();
    Mlp::from_layers(vec![first, second], Activation::Relu).unwrap()
}

/// Softmax of `[s, -s, s/2]` for `s = 2·relu(x0 + x1)`, in f64.
fn overflowing_reference(row: [f64; 2]) -> Vec<f64> {
    let s = 2.0 * (row[0] + row[1]).max(0.0);
    let logits = [s, -s, s / 2.0];
    let total: f64 = logits.iter().map(|l| (l - s).exp()).sum();
    logits.iter().map(|l| (l - s).exp() / total).collect()
}

/// Item 10: finite inputs near ±3.4e38 overflow f32 inside the model; that row is a 422 naming
/// it, never a 200 with null probabilities, and requests merged with it are still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_overflow_f32_are_422_naming_the_row() {
    let config = Config { max_wait: Duration::from_millis(20), ..Config::default() };
    let base = serve(Model::from_mlp(overflowing_mlp()), config).await;
    let url = format!("{base}/v1/predict");
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            if i % 2 == 0 {
                // 3e38 + 3e38 is inf in f32, and the logits become [inf, -inf, inf].
                let rows = serde_json::json!({"inputs": [[1.0, 2.0], [3.0e38, 3.0e38]]});
                let answer = client.post(&url).json(&rows).send().await.unwrap();
                assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
                let body: ErrorBody = answer.json().await.unwrap();
                assert!(body.error.contains("row 1") && body.error.contains("not finite"), "{}", body.error);
            } else {
                // -3e38 - 3e38 is -inf, which relu makes 0: finite, and right.
                let rows = [[1.0f32, 2.0], [-3.0e38, -3.0e38], [0.25, -0.5]];
                let answer = client.post(&url).json(&serde_json::json!({ "inputs": rows })).send().await.unwrap();
                assert_eq!(answer.status(), StatusCode::OK);
                let outputs: PredictResponse = answer.json().await.unwrap();
                for (out, row) in outputs.outputs.iter().zip(rows) {
                    let expected = overflowing_reference([f64::from(row[0]), f64::from(row[1])]);
                    for (got, want) in out.probabilities.iter().zip(&expected) {
                        assert!(
                            (f64::from(*got) - want).abs() < 1e-6,
                            "{row:?}: {:?} vs {expected:?}",
                            out.probabilities
                        );
                    }
                    assert_eq!(out.class, 0);
                }
            }
        });
    }
    let mut done = 0;
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
        done += 1;
    }
    assert_eq!(done, 20);
    // Inputs that are not finite f32 are refused before they reach the model.
    for (body, needle) in [
        ("{\"inputs\": [[-1e39, 1.0]]}", "row 0 has a value that is not a finite f32"),
        ("{\"inputs\": [[1.0, 1.0], [1.0, 1e39]]}", "row 1 has a value that is not a finite f32"),
        ("{\"inputs\": [[1e400, 1.0]]}", "out of range"),
        ("{\"inputs\": [[NaN, 1.0]]}", "malformed"),
    ] {
        let answer = client.post(&url).header("content-type", "application/json").body(body).send().await.unwrap();
        assert!(answer.status().is_client_error(), "{body}: {}", answer.status());
        let error: ErrorBody = answer.json().await.unwrap();
        assert!(error.error.contains(needle), "{body}: {}", error.error);
    }
}

/// Item 11, as the service sees it: a model file with a NaN weight is refused at load, naming the
/// tensor; it used to load and answer NaN.
#[test]
fn a_model_file_with_nan_weights_fails_to_load_naming_the_tensor() {
    let t = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape.to_vec(), Device::Cpu).unwrap();
    let layer = Linear::from_tensors(t(vec![1.0, f32::NAN, 0.5, 2.0], &[2, 2]), t(vec![0.0; 2], &[2]), None).unwrap();
    let mlp = Mlp::from_layers(vec![layer], Activation::Relu).unwrap();
    let path = std::env::temp_dir().join(format!("opsmith-serve-nan-{}.safetensors", std::process::id()));
    mlp.save_safetensors(&path).unwrap();
    let loaded = Model::load(&path, Device::Cpu);
    std::fs::remove_file(&path).ok();
    match loaded {
        Err(StartError::Model(opsmith::autograd::Error::InvalidModel { tensor, reason, .. })) => {
            assert_eq!(tensor, "layers.0.weight");
            assert!(reason.contains("element 1") && reason.contains("NaN"), "{reason}");
        }
        Err(other) => panic!("expected InvalidModel, got {other}"),
        Ok(model) => panic!("expected InvalidModel, loaded a model with {} classes", model.classes()),
    }
}

/// The value of the sample `series` (name and labels, as rendered) in a Prometheus text scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The `le` buckets of one histogram series, in order: (bound, cumulative count).
fn buckets(text: &str, name: &str, labels: &str) -> Vec<(String, f64)> {
    let prefix = format!("{name}_bucket{{{labels}le=\"");
    text.lines()
        .filter_map(|l| {
            let (le, value) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
            Some((le.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// After known requests, `/metrics` counts each by route and status, times each, and its batch
/// histograms hold exactly the batches run, in the Prometheus text format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_and_time_the_requests_made() {
    let (base, weights) = start(Config::default()).await;
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/predict");
    // One at a time, so each is a batch of its own: 1 + 2 + 3 + 4 + 5 rows.
    for n in 1..=5 {
        let rows: Vec<Vec<f32>> = (0..n).map(|r| row(n, r)).collect();
        let answer = client.post(&url).json(&serde_json::json!({ "inputs": rows })).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        check(&answer.json().await.unwrap(), &weights, &rows);
    }
    for _ in 0..2 {
        let answer = client.post(&url).json(&serde_json::json!({"inputs": [[1.0, 2.0, 3.0]]})).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
    assert_eq!(client.get(format!("{base}/healthz")).send().await.unwrap().status(), StatusCode::OK);
    assert_eq!(client.get(format!("{base}/v2/predict")).send().await.unwrap().status(), StatusCode::NOT_FOUND);

    let answer = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let content_type = answer.headers()["content-type"].to_str().unwrap().to_string();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = answer.text().await.unwrap();
    let requests = |route: &str, status: u16| {
        sample(&text, &format!("opsmith_serve_requests_total{{route=\"{route}\",status=\"{status}\"}}"))
    };
    assert_eq!(requests("/v1/predict", 200), Some(5.0), "{text}");
    assert_eq!(requests("/v1/predict", 422), Some(2.0), "{text}");
    assert_eq!(requests("/healthz", 200), Some(1.0), "{text}");
    // Paths that are no route share one label.
    assert_eq!(requests("other", 404), Some(1.0), "{text}");
    // A scrape is counted once answered: not in its own text.
    assert_eq!(requests("/metrics", 200), None, "{text}");

    // Latency: 7 predictions, buckets cumulative, +Inf equal to the count, a plausible sum.
    let latency = "opsmith_serve_request_duration_seconds";
    let predict = buckets(&text, latency, "route=\"/v1/predict\",");
    assert_eq!(predict.len(), 15, "{text}");
    assert!(predict.windows(2).all(|w| w[0].1 <= w[1].1), "{predict:?}");
    assert_eq!(predict.last(), Some(&("+Inf".to_string(), 7.0)));
    assert_eq!(sample(&text, &format!("{latency}_count{{route=\"/v1/predict\"}}")), Some(7.0));
    let seconds = sample(&text, &format!("{latency}_sum{{route=\"/v1/predict\"}}")).unwrap();
    assert!(seconds > 0.0 && seconds < 7.0 * PATIENCE.as_secs_f64(), "{seconds}");
    assert_eq!(sample(&text, &format!("{latency}_count{{route=\"/healthz\"}}")), Some(1.0));

    // Batches: five of 1..=5 rows, one request each.
    let rows = buckets(&text, "opsmith_serve_batch_rows", "");
    let at = |le: &str| rows.iter().find(|(b, _)| b == le).map(|(_, v)| *v);
    assert_eq!(
        (at("1"), at("2"), at("4"), at("8"), at("+Inf")),
        (Some(1.0), Some(2.0), Some(4.0), Some(5.0), Some(5.0))
    );
    assert_eq!(sample(&text, "opsmith_serve_batch_rows_sum"), Some(15.0));
    assert_eq!(sample(&text, "opsmith_serve_batch_rows_count"), Some(5.0));
    assert_eq!(sample(&text, "opsmith_serve_batch_requests_sum"), Some(5.0));
    assert_eq!(sample(&text, "opsmith_serve_batch_requests_bucket{le=\"1\"}"), Some(5.0));
    assert_eq!(sample(&text, "opsmith_serve_queue_depth"), Some(0.0));

    // Each family: HELP, then TYPE, then its samples.
    for (family, kind) in [
        ("opsmith_serve_requests_total", "counter"),
        (latency, "histogram"),
        ("opsmith_serve_batch_rows", "histogram"),
        ("opsmith_serve_batch_requests", "histogram"),
        ("opsmith_serve_queue_depth", "gauge"),
    ] {
        let lines: Vec<&str> = text.lines().collect();
        let help = lines.iter().position(|l| l.starts_with(&format!("# HELP {family} "))).expect(family);
        assert_eq!(lines[help + 1], format!("# TYPE {family} {kind}"));
        let first = lines.iter().position(|l| l.starts_with(family)).expect(family);
        assert_eq!(first, help + 2, "{family}: samples follow HELP and TYPE");
    }
    // Every sample line is `name{labels} value` with a number.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (_, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok() || value == "+Inf", "{line}");
    }

    // The next scrape counts the first.
    let text = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(sample(&text, "opsmith_serve_requests_total{route=\"/metrics\",status=\"200\"}"), Some(1.0));
}

/// [`Args`] from an explicit argument list, with the environment variables switched off (so
/// that an `OPSMITH_SERVE_*` set where the tests run cannot change the result; tests/process.rs
/// checks the variables themselves).
fn parse(args: &[&str]) -> Result<Args, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let command = Args::command().mut_args(|arg| arg.env(None::<&'static str>));
    Args::from_arg_matches(&command.try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()))?)
}

/// Every flag lands in its `Config` field; no flags give `Config::default()`; bad values and
/// unknown flags are errors that name the flag.
#[test]
fn the_command_line_parses_into_a_config() {
    let defaults = parse(&[]).unwrap();
    assert_eq!(format!("{:?}", defaults.config()), format!("{:?}", Config::default()));
    assert_eq!((defaults.log_format, defaults.log_level, defaults.once), (LogFormat::Text, LogLevel::Info, false));
    assert_eq!(defaults.listen_addr(), "127.0.0.1:8080".parse().unwrap());
    assert_eq!(defaults.model, std::path::PathBuf::from("target/mlp.safetensors"));

    let args = parse(&[
        "--model",
        "m.safetensors",
        "--addr",
        "0.0.0.0:9000",
        "--device",
        "cpu",
        "--workers",
        "3",
        "--max-request-rows",
        "16",
        "--max-merged-rows",
        "64",
        "--max-wait-us",
        "250",
        "--queue-capacity",
        "8",
        "--max-body-bytes",
        "1000",
        "--max-connections",
        "5",
        "--header-timeout-ms",
        "11",
        "--body-timeout-ms",
        "12",
        "--request-timeout-ms",
        "13",
        "--send-timeout-ms",
        "14",
        "--log-format",
        "json",
        "--log-level",
        "debug",
    ])
    .unwrap();
    let config = args.config();
    assert_eq!(
        (config.workers, config.max_request_rows, config.max_merged_rows, config.queue_capacity),
        (3, 16, 64, 8)
    );
    assert_eq!((config.max_body_bytes, config.max_connections), (1000, 5));
    assert_eq!(config.max_wait, Duration::from_micros(250));
    let ms = Duration::from_millis;
    assert_eq!(
        (config.header_timeout, config.body_timeout, config.request_timeout, config.send_timeout),
        (ms(11), ms(12), ms(13), ms(14))
    );
    assert_eq!((args.log_format, args.log_level, args.device()), (LogFormat::Json, LogLevel::Debug, Device::Cpu));
    assert_eq!(args.listen_addr(), "0.0.0.0:9000".parse().unwrap());
    assert_eq!(args.model, std::path::PathBuf::from("m.safetensors"));

    // --once picks a free loopback port, unless --addr says where.
    assert_eq!(parse(&["--once"]).unwrap().listen_addr(), "127.0.0.1:0".parse().unwrap());
    assert_eq!(parse(&["--once", "--addr", "127.0.0.1:7"]).unwrap().listen_addr(), "127.0.0.1:7".parse().unwrap());

    for (bad, needle) in [
        (&["--log-format", "xml"][..], "--log-format"),
        (&["--workers", "two"], "--workers"),
        (&["--workers=-1"], "--workers"),
        (&["--device", "tpu"], "--device"),
        (&["--addr", "localhost"], "--addr"),
        (&["--port", "80"], "--port"),
    ] {
        let e = parse(bad).expect_err(needle);
        assert!(e.to_string().contains(needle), "{bad:?}: {e}");
        assert_eq!(e.exit_code(), 2, "{bad:?}");
    }
    // --help names each flag's environment variable.
    let help = <Args as clap::CommandFactory>::command().render_long_help().to_string();
    for var in ["OPSMITH_SERVE_MODEL", "OPSMITH_SERVE_WORKERS", "OPSMITH_SERVE_LOG_FORMAT", "OPSMITH_SERVE_ONCE"] {
        assert!(help.contains(var), "--help lacks {var}");
    }
}

/// `serve_until`: once the shutdown future completes, the request in flight (held by a 1.5 s
/// merge wait) is still answered, right, and only then does `serve_until` return; a connection
/// opened after the stop is not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_answers_the_request_in_flight() {
    let mlp = Mlp::new(&Tape::new(), &SIZES, Activation::Relu, DType::F32, Device::Cpu, 9).unwrap();
    let weights: Vec<_> = mlp
        .layers()
        .iter()
        .map(|l| (l.weight().value().to_vec_f64().unwrap(), l.bias().value().to_vec_f64().unwrap()))
        .collect();
    let hold = Duration::from_millis(1500);
    let config = Config { workers: 1, max_wait: hold, ..Config::default() };
    let server = Server::new(Arc::new(Model::from_mlp(mlp)), config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve_until(listener, async {
        let _ = stopped.await;
    }));
    let rows = vec![row(4, 0), row(4, 1)];
    let sent = Instant::now();
    let in_flight = tokio::spawn({
        let (url, rows) = (format!("{base}/v1/predict"), rows.clone());
        async move { reqwest::Client::new().post(url).json(&serde_json::json!({ "inputs": rows })).send().await }
    });
    // Well inside the merge wait: the request is in the queue or with the worker.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(()).unwrap();
    let stopped_at = sent.elapsed();
    let answer = tokio::time::timeout(PATIENCE, in_flight).await.unwrap().unwrap().unwrap();
    let answered_at = sent.elapsed();
    assert_eq!(answer.status(), StatusCode::OK);
    check(&answer.json().await.unwrap(), &weights, &rows);
    assert!(
        answered_at >= hold - Duration::from_millis(50) && stopped_at < answered_at,
        "{stopped_at:?} {answered_at:?}"
    );
    tokio::time::timeout(PATIENCE, serving).await.expect("serve_until returns after the last answer").unwrap();
    // Nobody accepts any more: the listener is closed.
    let late = reqwest::Client::new().get(format!("{base}/healthz")).timeout(Duration::from_secs(2)).send().await;
    assert!(late.is_err(), "served after the stop: {late:?}");
}
