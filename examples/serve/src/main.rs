//! `serve`: the MLP that `train_mlp` wrote, behind `POST /v1/predict`, `GET /healthz` and
//! `GET /metrics`.
//!
//! ```text
//! cargo run --release --example train_mlp                  # writes target/mlp.safetensors
//! cargo run --release -p opsmith-example-serve -- --addr 127.0.0.1:8080
//! OPSMITH_SERVE_WORKERS=4 OPSMITH_SERVE_LOG_FORMAT=json cargo run --release -p opsmith-example-serve
//! curl -s localhost:8080/v1/predict -H 'content-type: application/json' -d '{"inputs": [[0.3, -0.2]]}'
//! curl -s localhost:8080/metrics
//! ```
//!
//! `--help` lists every flag and its environment variable. SIGTERM or Ctrl-C stops the service
//! gracefully: no new connections, the requests in flight are answered, then it exits 0.
//!
//! `--once` starts the service on a free loopback port, sends it one health check and one
//! prediction through an HTTP client, prints both answers and exits: 0 when both are 200 (what
//! CI runs).
use clap::Parser;
use opsmith_example_serve::cli::{Args, LogFormat, flag_for};
use opsmith_example_serve::{Model, Server, StartError};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::level_filters::LevelFilter;

#[tokio::main]
async fn main() {
    // Bad flags: clap's message and usage, exit status 2.
    let args = Args::parse();
    let level = LevelFilter::from(args.log_level);
    // Logs go to stderr, so that `--once` prints only its answers on stdout.
    let logs = tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(level);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    if let Err(e) = run(args).await {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let (device, config) = (args.device(), args.config());
    let model = Arc::new(Model::load(&args.model, device).map_err(|e| match e {
        // A missing or unreadable file: say how to make one. A file that is there but invalid
        // names its tensor, and needs no hint.
        StartError::Model(opsmith::autograd::Error::ModelFile { .. }) => {
            format!("{e} (run `cargo run --release --example train_mlp` first to write it)")
        }
        other => other.to_string(),
    })?);
    let features = model.features();
    let server = Server::new(model, config.clone()).map_err(|e| match &e {
        StartError::Config(bad) => match flag_for(bad) {
            Some((flag, var)) => format!("{e} (set by {flag} or {var})"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    })?;
    let listener = tokio::net::TcpListener::bind(args.listen_addr()).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, %device, workers = config.workers, model = %args.model.display(), "serving");
    if args.once {
        return once(server, listener, addr, features).await;
    }
    server.serve_until(listener, shutdown_signal()).await;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on SIGTERM (how container runtimes and systemd stop a service) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            // Without a handler, wait for SIGTERM alone rather than stop at once.
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        () = terminate => tracing::info!("SIGTERM: shutting down"),
    }
}

/// `--once`: one health check and one prediction over HTTP, then a graceful stop.
async fn once(
    server: Server,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    features: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve_until(listener, async {
        let _ = stopped.await;
    }));
    // Loopback only: a proxy from the environment (HTTP_PROXY) must not take these requests.
    let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build()?;
    let base = format!("http://{addr}");
    let health = client.get(format!("{base}/healthz")).send().await?;
    let health_status = health.status();
    println!("GET /healthz      -> {health_status}  {}", health.text().await?);
    let row: Vec<f64> = (0..features).map(|i| 0.3 - 0.2 * i as f64).collect();
    let predicted =
        client.post(format!("{base}/v1/predict")).json(&serde_json::json!({ "inputs": [row] })).send().await?;
    let predict_status = predicted.status();
    println!("POST /v1/predict  -> {predict_status}  {}", predicted.text().await?);
    let _ = stop.send(());
    serving.await?;
    if !health_status.is_success() || !predict_status.is_success() {
        return Err(format!("--once: /healthz answered {health_status}, /v1/predict answered {predict_status}").into());
    }
    Ok(())
}
