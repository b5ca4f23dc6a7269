//! Starts the service on a loopback port and sends it real HTTP requests: 1,000 concurrent
//! ones, every tenth of them bad, each answer checked against an f64 forward pass of the same
//! weights; then each kind of bad request alone, and a good one after them.
use opsmith::autograd::Tape;
use opsmith::autograd::nn::{Activation, Mlp};
use opsmith::{DType, Device};
use opsmith_example_serve::{Config, ErrorBody, Model, PredictResponse, router};
use reqwest::StatusCode;
use std::sync::Arc;

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
    let model = Arc::new(Model::load(&path, device).unwrap());
    let app = router(model, config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), weights)
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

    let health: serde_json::Value = client.get(format!("{base}/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["sizes"], serde_json::json!(SIZES));
}
