//! The worker machinery with a stand-in inference that panics or stalls on purpose (the real
//! model has no input that does): a panic fails only its own request, a request that does not
//! fit a batch never runs under the queue's lock, a request whose client gave up is not
//! computed, `/healthz` reports workers that have stopped, and `/metrics` counts the requests
//! waiting behind a slow batch.
use super::*;
use opsmith::DType;
use opsmith::autograd::Tape;
use opsmith::autograd::nn::Activation;

fn model() -> Arc<Model> {
    let mlp = Mlp::new(&Tape::new(), &[2, 8, 3], Activation::Relu, DType::F32, Device::Cpu, 4).unwrap();
    Arc::new(Model::from_mlp(mlp))
}

/// The probabilities for `row`, in f64 from the model's weights.
fn reference(model: &Model, row: [f32; 2]) -> Vec<f64> {
    let mut h: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
    let layers = model.mlp.layers();
    for (i, layer) in layers.iter().enumerate() {
        let (w, b) = (layer.weight().value().to_vec_f64().unwrap(), layer.bias().value().to_vec_f64().unwrap());
        let mut next = b.clone();
        for (k, x) in h.iter().enumerate() {
            for (j, out) in next.iter_mut().enumerate() {
                *out += x * w[k * b.len() + j];
            }
        }
        if i + 1 < layers.len() {
            next.iter_mut().for_each(|v| *v = v.max(0.0));
        }
        h = next;
    }
    let max = h.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = h.iter().map(|v| (v - max).exp()).sum();
    h.iter().map(|v| (v - max).exp() / total).collect()
}

/// The first feature of each row of every batch the stand-in was given.
type Calls = Arc<Mutex<Vec<Vec<f32>>>>;

/// The real inference, except that a batch with a row starting with 13 panics, and one with a
/// row starting with 7 sleeps `slow` first.
fn rigged(slow: Duration, calls: Calls) -> Arc<PredictFn> {
    Arc::new(move |model: &Model, inputs: &[f32], rows| {
        let firsts: Vec<f32> = inputs.chunks(2).map(|r| r[0]).collect();
        calls.lock().unwrap().push(firsts.clone());
        if firsts.contains(&13.0) {
            panic!("rigged to panic on 13");
        }
        if firsts.contains(&7.0) {
            std::thread::sleep(slow);
        }
        model.predict(inputs, rows)
    })
}

async fn serve_rigged(model: Arc<Model>, config: Config, predict: Arc<PredictFn>) -> String {
    let server = Server { router: app(model, config.clone(), predict).unwrap(), config };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server.serve(listener));
    format!("http://{addr}")
}

async fn post(client: &reqwest::Client, base: &str, rows: &[[f32; 2]]) -> (StatusCode, serde_json::Value) {
    let answer = client.post(format!("{base}/v1/predict")).json(&serde_json::json!({ "inputs": rows })).send();
    let answer = tokio::time::timeout(Duration::from_secs(10), answer).await.unwrap().unwrap();
    (answer.status(), answer.json().await.unwrap())
}

/// A 200 whose probabilities match the f64 reference for `rows`.
fn assert_right(model: &Model, (status, body): &(StatusCode, serde_json::Value), rows: &[[f32; 2]]) {
    assert_eq!(*status, StatusCode::OK, "{body}");
    let outputs: PredictResponse = serde_json::from_value(body.clone()).unwrap();
    assert_eq!(outputs.outputs.len(), rows.len());
    for (out, row) in outputs.outputs.iter().zip(rows) {
        let expected = reference(model, *row);
        for (got, want) in out.probabilities.iter().zip(&expected) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{row:?}: {:?} vs {expected:?}", out.probabilities);
        }
    }
}

async fn health(client: &reqwest::Client, base: &str) -> (StatusCode, serde_json::Value) {
    let answer = client.get(format!("{base}/healthz")).send().await.unwrap();
    (answer.status(), answer.json().await.unwrap())
}

/// One worker: a panic is a 500 for its request, and the worker goes on to answer the next;
/// merged with a good request, the panic fails only itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_fails_only_its_own_request() {
    let (model, calls) = (model(), Calls::default());
    let config = Config { workers: 1, max_wait: Duration::from_millis(300), ..Config::default() };
    let base = serve_rigged(model.clone(), config, rigged(Duration::ZERO, calls.clone())).await;
    let client = reqwest::Client::new();

    let (status, body) = post(&client, &base, &[[13.0, 0.0]]).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body["error"].as_str().unwrap().contains("panicked: rigged to panic on 13"), "{body}");
    let good = [[0.5, -1.0]];
    assert_right(&model, &post(&client, &base, &good).await, &good);

    // Both arrive within max_wait, so they are merged; the batch panics, each runs again alone.
    let bad = tokio::spawn({
        let (client, base) = (client.clone(), base.clone());
        async move { post(&client, &base, &[[13.0, 1.0]]).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let good = [[0.25, 0.5], [1.0, 1.0]];
    assert_right(&model, &post(&client, &base, &good).await, &good);
    assert_eq!(bad.await.unwrap().0, StatusCode::INTERNAL_SERVER_ERROR);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls[2..], [vec![13.0, 0.25, 1.0], vec![13.0], vec![0.25, 1.0]], "{calls:?}");

    let (status, body) = health(&client, &base).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&body["status"], &body["workers_alive"], &body["inference_panics"]),
        (&"ok".into(), &1.into(), &3.into())
    );
}

/// Two workers, at most two rows a batch. Worker 1 takes F (one row), and while it waits for
/// more, S (two rows, slow) arrives and does not fit. S must wait for the next batch outside
/// the lock: F is answered at once, and worker 2 takes G meanwhile. (Run under the lock, S held
/// up F and G both for its whole 1.5 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_that_does_not_fit_runs_outside_the_queue_lock() {
    let (model, calls) = (model(), Calls::default());
    let config = Config {
        workers: 2,
        max_request_rows: 2,
        max_merged_rows: 2,
        max_wait: Duration::from_millis(300),
        ..Config::default()
    };
    let base = serve_rigged(model.clone(), config, rigged(Duration::from_millis(1500), calls)).await;
    let client = reqwest::Client::new();
    let send = |rows: Vec<[f32; 2]>| {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move {
            let since = Instant::now();
            let answer = post(&client, &base, &rows).await;
            (answer, since.elapsed(), rows)
        })
    };
    let f = send(vec![[0.5, 0.5]]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let s = send(vec![[7.0, 0.0], [7.0, 1.0]]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let g = send(vec![[0.25, 0.25]]);
    for (name, task, limit) in
        [("F", f, Duration::from_secs(1)), ("G", g, Duration::from_secs(1)), ("S", s, Duration::from_secs(5))]
    {
        let (answer, took, rows) = task.await.unwrap();
        assert_right(&model, &answer, &rows);
        assert!(took < limit, "{name} took {took:?}");
    }
}

/// A request whose client gave up (here: the request timeout answered it) is dropped from the
/// queue, not computed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_gave_up_is_not_computed() {
    let (model, calls) = (model(), Calls::default());
    let config = Config {
        workers: 1,
        max_request_rows: 2,
        max_merged_rows: 2,
        max_wait: Duration::ZERO,
        request_timeout: Duration::from_millis(300),
        ..Config::default()
    };
    let base = serve_rigged(model.clone(), config, rigged(Duration::from_millis(800), calls.clone())).await;
    let client = reqwest::Client::new();
    let slow = tokio::spawn({
        let (client, base) = (client.clone(), base.clone());
        async move { post(&client, &base, &[[7.0, 0.0], [7.0, 0.0]]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Queued behind the slow one; times out before the worker is free.
    let (status, body) = post(&client, &base, &[[5.0, 0.0]]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body["error"].as_str().unwrap().contains("request timeout"), "{body}");
    assert_eq!(slow.await.unwrap().0, StatusCode::SERVICE_UNAVAILABLE);
    // Once the slow batch is done, a later request is answered, and 5.0 never reached the model.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let good = [[0.5, 0.5]];
    assert_right(&model, &post(&client, &base, &good).await, &good);
    assert_eq!(*calls.lock().unwrap(), [vec![7.0, 7.0], vec![0.5]]);
}

/// `/healthz` follows the workers: all running is "ok", some stopped is "degraded" (200, they
/// still answer), none is 503 "unavailable"; the reason says which stopped last, and how.
#[tokio::test]
async fn healthz_reports_workers_that_have_stopped() {
    let workers = Arc::new(Workers {
        configured: 2,
        alive: AtomicUsize::new(0),
        panics: AtomicU64::new(0),
        last_exit: Mutex::new(None),
        metrics: Arc::new(Metrics::default()),
    });
    let state = Arc::new(AppState {
        model: model(),
        config: Config::default(),
        queue: sync_channel(1).0,
        workers: workers.clone(),
    });
    let check = |state: Arc<AppState>| async move {
        let response = healthz(State(state)).await;
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice::<serde_json::Value>(&body).unwrap())
    };
    // Each worker thread holds its `Alive`; it counts until the thread ends.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let spawn = |index: usize, panics: bool, stop: std::sync::mpsc::Receiver<()>| {
        let (workers, started) = (workers.clone(), started_tx.clone());
        std::thread::spawn(move || {
            let _alive = Alive::new(workers, index);
            started.send(()).unwrap();
            let _ = stop.recv();
            assert!(!panics, "worker {index} rigged to panic");
        })
    };
    let (stop_tx_1, stop_rx_1) = std::sync::mpsc::channel::<()>();
    let first = spawn(0, true, stop_rx);
    let second = spawn(1, false, stop_rx_1);
    for _ in 0..2 {
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    }
    let (status, body) = check(state.clone()).await;
    assert_eq!((status, &body["status"], &body["workers_alive"]), (StatusCode::OK, &"ok".into(), &2.into()));
    assert!(body.get("reason").is_none(), "{body}");

    drop(stop_tx);
    assert!(first.join().is_err(), "worker 0 panicked");
    let (status, body) = check(state.clone()).await;
    assert_eq!((status, &body["status"], &body["workers_alive"]), (StatusCode::OK, &"degraded".into(), &1.into()));
    assert_eq!(body["reason"], "1 of 2 workers have stopped (last: worker 0 panicked)");

    drop(stop_tx_1);
    second.join().unwrap();
    let (status, body) = check(state).await;
    assert_eq!(
        (status, &body["status"], &body["workers_alive"]),
        (StatusCode::SERVICE_UNAVAILABLE, &"unavailable".into(), &0.into())
    );
    assert_eq!(body["reason"], "2 of 2 workers have stopped (last: worker 1 stopped)");
}

/// The value of the sample `series` (name and labels, as rendered) in a Prometheus text scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn scrape(client: &reqwest::Client, base: &str) -> String {
    let answer = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    answer.text().await.unwrap()
}

/// One worker, held by a slow batch: the requests sent meanwhile show as the queue's depth
/// (2), and once all are answered it is 0 again. The batch histograms agree with the batches
/// the model was actually given.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_show_the_requests_waiting_behind_a_slow_batch() {
    let (model, calls) = (model(), Calls::default());
    let config = Config { workers: 1, max_wait: Duration::ZERO, ..Config::default() };
    let base = serve_rigged(model.clone(), config, rigged(Duration::from_millis(1500), calls.clone())).await;
    let client = reqwest::Client::new();
    let send = |rows: Vec<[f32; 2]>| {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move { (post(&client, &base, &rows).await, rows) })
    };
    let slow = send(vec![[7.0, 0.0]]);
    // Until the worker holds the slow batch.
    let since = Instant::now();
    while calls.lock().unwrap().is_empty() {
        assert!(since.elapsed() < Duration::from_secs(5), "the slow request never reached the model");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = [send(vec![[0.5, 0.5]]), send(vec![[0.25, 0.25], [1.0, 0.0]])];
    let mut depth = None;
    while since.elapsed() < Duration::from_secs(5) {
        let text = scrape(&client, &base).await;
        depth = sample(&text, "opsmith_serve_queue_depth");
        if depth == Some(2.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(depth, Some(2.0), "the two requests behind the slow batch");
    assert_eq!(calls.lock().unwrap().len(), 1, "the slow batch was still running");
    for task in std::iter::once(slow).chain(waiting) {
        let (answer, rows) = task.await.unwrap();
        assert_right(&model, &answer, &rows);
    }
    let text = scrape(&client, &base).await;
    assert_eq!(sample(&text, "opsmith_serve_queue_depth"), Some(0.0), "{text}");
    let calls = calls.lock().unwrap().clone();
    let rows: usize = calls.iter().map(Vec::len).sum();
    assert_eq!(rows, 4, "{calls:?}");
    assert_eq!(sample(&text, "opsmith_serve_batch_rows_count"), Some(calls.len() as f64), "{text}");
    assert_eq!(sample(&text, "opsmith_serve_batch_rows_sum"), Some(4.0), "{text}");
    assert_eq!(sample(&text, "opsmith_serve_batch_requests_sum"), Some(3.0), "{text}");
    assert_eq!(sample(&text, "opsmith_serve_requests_total{route=\"/v1/predict\",status=\"200\"}"), Some(3.0));
}
