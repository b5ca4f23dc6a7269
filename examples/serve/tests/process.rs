//! Runs the `serve` binary as a child process: configuration from `OPSMITH_SERVE_*` environment
//! variables (a flag beats its variable), JSON log lines, a bad value named at start, and a
//! graceful stop on SIGTERM and on Ctrl-C (SIGINT) with a request in flight, exiting 0.
//!
//! Not part of the GPU bundle (scripts/gpu-bundle.sh copies the `http` suite only): the binary's
//! path is this machine's.
use opsmith::autograd::Tape;
use opsmith::autograd::nn::{Activation, Mlp};
use opsmith::{DType, Device};
use reqwest::StatusCode;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// Bounds every wait: a child that never answers fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(20);

/// A model file of its own for each test (they run in parallel), removed when dropped.
struct ModelFile(PathBuf);

impl ModelFile {
    fn new(name: &str) -> ModelFile {
        let mlp = Mlp::new(&Tape::new(), &[2, 16, 3], Activation::Relu, DType::F32, Device::Cpu, 3).unwrap();
        let path =
            std::env::temp_dir().join(format!("opsmith-serve-process-{}-{name}.safetensors", std::process::id()));
        mlp.save_safetensors(&path).unwrap();
        ModelFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ModelFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The serve binary with `env` and `args`, and no `OPSMITH_SERVE_*` from the test's own
/// environment; its stderr (the logs) comes line by line through the receiver.
struct Serve {
    child: Child,
    logs: Receiver<String>,
    seen: Vec<String>,
}

impl Serve {
    fn start(env: &[(&str, &str)], args: &[&str]) -> Serve {
        let mut command = Command::new(env!("CARGO_BIN_EXE_opsmith-example-serve"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("OPSMITH_SERVE_") {
                command.env_remove(key);
            }
        }
        command.envs(env.iter().copied()).args(args).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, logs) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Serve { child, logs, seen: Vec::new() }
    }

    /// The first log line (from here on) for which `wanted` holds.
    fn wait_for(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.logs.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("no log line {what} within {PATIENCE:?}; seen:\n{}", self.seen.join("\n"));
                }
            }
        }
    }

    /// The exit status, waiting at most `PATIENCE`; then every log line it wrote.
    fn exit(mut self) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("still running after {PATIENCE:?}; logs:\n{}", self.seen.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader ends at EOF: the rest of the lines are in the channel.
        self.seen.extend(self.logs.iter());
        (status, self.seen)
    }

    #[cfg(unix)]
    fn signal(&self, name: &str) {
        let status = Command::new("kill").args(["-s", name, &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill -s {name}");
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(PATIENCE).build().unwrap()
}

/// Configured through the environment alone, with one flag over its variable: the service
/// listens where OPSMITH_SERVE_ADDR says, on the CPU, takes at most OPSMITH_SERVE_MAX_REQUEST_ROWS
/// rows, runs `--workers 1` rather than OPSMITH_SERVE_WORKERS=3, and logs one JSON object a
/// line at OPSMITH_SERVE_LOG_LEVEL=debug, a line per request included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_variables_configure_the_service_and_logs_are_json() {
    let model = ModelFile::new("env");
    let mut serve = Serve::start(
        &[
            ("OPSMITH_SERVE_MODEL", model.path()),
            ("OPSMITH_SERVE_ADDR", "127.0.0.1:0"),
            ("OPSMITH_SERVE_DEVICE", "cpu"),
            ("OPSMITH_SERVE_WORKERS", "3"),
            ("OPSMITH_SERVE_MAX_REQUEST_ROWS", "4"),
            ("OPSMITH_SERVE_LOG_FORMAT", "json"),
            ("OPSMITH_SERVE_LOG_LEVEL", "debug"),
        ],
        &["--workers", "1"],
    );
    let line = serve.wait_for("\"serving\"", |l| l.contains("\"serving\""));
    let start: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(start["level"], "INFO", "{line}");
    assert_eq!((&start["fields"]["device"], &start["fields"]["workers"]), (&"cpu".into(), &1.into()), "{line}");
    let base = format!("http://{}", start["fields"]["addr"].as_str().unwrap());

    let client = client();
    let health: serde_json::Value = client.get(format!("{base}/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!((&health["workers"], &health["device"]), (&1.into(), &"cpu".into()), "{health}");
    let url = format!("{base}/v1/predict");
    let too_many =
        client.post(&url).json(&serde_json::json!({ "inputs": vec![[0.5f32, 0.5]; 5] })).send().await.unwrap();
    assert_eq!(too_many.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(too_many.text().await.unwrap().contains("the limit is 4"));
    let four = client.post(&url).json(&serde_json::json!({ "inputs": vec![[0.5f32, 0.5]; 4] })).send().await.unwrap();
    assert_eq!(four.status(), StatusCode::OK);

    serve.child.kill().unwrap();
    let (_, logs) = serve.exit();
    let events: Vec<serde_json::Value> = logs
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
        .collect();
    for event in &events {
        assert!(event["timestamp"].is_string() && event["level"].is_string(), "{event}");
    }
    let requests: Vec<(String, i64)> = events
        .iter()
        .filter(|e| e["fields"]["message"] == "request" && e["level"] == "DEBUG")
        .map(|e| (e["fields"]["route"].as_str().unwrap().to_string(), e["fields"]["status"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        requests,
        [("/healthz".into(), 200), ("/v1/predict".into(), 413), ("/v1/predict".into(), 200)],
        "{logs:#?}"
    );
}

/// A value the service cannot use, from the environment, stops it at start with exit status 1
/// and a message naming the variable; one that is not a number is clap's error, status 2.
#[test]
fn a_bad_value_from_the_environment_fails_at_start_naming_it() {
    let file = ModelFile::new("bad");
    let model = file.path();
    // A 40 s merge wait is longer than the 30 s request timeout.
    let serve = Serve::start(
        &[("OPSMITH_SERVE_MODEL", model), ("OPSMITH_SERVE_DEVICE", "cpu"), ("OPSMITH_SERVE_MAX_WAIT_US", "40000000")],
        &["--addr", "127.0.0.1:0"],
    );
    let (status, logs) = serve.exit();
    assert_eq!(status.code(), Some(1), "{logs:#?}");
    let logs = logs.join("\n");
    assert!(logs.contains("max_wait") && logs.contains("OPSMITH_SERVE_MAX_WAIT_US"), "{logs}");

    let serve = Serve::start(&[("OPSMITH_SERVE_MODEL", model), ("OPSMITH_SERVE_WORKERS", "many")], &[]);
    let (status, logs) = serve.exit();
    assert_eq!(status.code(), Some(2), "{logs:#?}");
    assert!(logs.join("\n").contains("invalid value 'many' for '--workers"), "{logs:#?}");
}

/// SIGTERM, then SIGINT (Ctrl-C): each arrives while a request is held in the worker's 1.5 s
/// merge wait. The request is still answered 200 with its prediction, after the signal, and
/// the process then exits 0, having logged the stop.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_ctrl_c_let_the_request_in_flight_finish_then_exit_0() {
    let model = ModelFile::new("signals");
    for (signal, logged) in [("TERM", "SIGTERM: shutting down"), ("INT", "Ctrl-C: shutting down")] {
        let mut serve = Serve::start(
            &[],
            &[
                "--model",
                model.path(),
                "--device",
                "cpu",
                "--addr",
                "127.0.0.1:0",
                "--workers",
                "1",
                "--max-wait-us",
                "1500000",
                "--log-level",
                "debug",
            ],
        );
        // Text format: `... INFO opsmith_example_serve: serving addr=127.0.0.1:PORT device=cpu ...`
        let line = serve.wait_for("serving", |l| l.contains(" serving "));
        let addr = line.split_whitespace().find_map(|w| w.strip_prefix("addr=")).unwrap().to_string();
        let in_flight = tokio::spawn(async move {
            let answer = client()
                .post(format!("http://{addr}/v1/predict"))
                .json(&serde_json::json!({ "inputs": [[0.25, -0.5], [1.0, 2.0]] }))
                .send()
                .await;
            (answer, Instant::now())
        });
        serve.wait_for("request queued", |l| l.contains("request queued"));
        let signalled = Instant::now();
        serve.signal(signal);

        let (answer, answered) = in_flight.await.unwrap();
        let answer = answer.unwrap_or_else(|e| panic!("SIG{signal}: the request in flight failed: {e}"));
        assert_eq!(answer.status(), StatusCode::OK, "SIG{signal}");
        let body: serde_json::Value = answer.json().await.unwrap();
        let outputs = body["outputs"].as_array().unwrap();
        assert_eq!(outputs.len(), 2, "{body}");
        for output in outputs {
            let total: f64 = output["probabilities"].as_array().unwrap().iter().map(|p| p.as_f64().unwrap()).sum();
            assert!((total - 1.0).abs() < 1e-5, "{body}");
        }
        assert!(answered > signalled, "SIG{signal}: answered before the signal; nothing was in flight");

        let (status, logs) = serve.exit();
        assert!(status.success(), "SIG{signal}: {status}; logs:\n{}", logs.join("\n"));
        assert_eq!(status.code(), Some(0));
        for needle in [logged, "every connection has closed", " stopped"] {
            assert!(logs.iter().any(|l| l.contains(needle)), "SIG{signal}: no {needle:?} in\n{}", logs.join("\n"));
        }
    }
}
