//! `serve`: the MLP that `train_mlp` wrote, behind `POST /v1/predict` and `GET /healthz`.
//!
//! ```text
//! cargo run --release --example train_mlp                  # writes target/mlp.safetensors
//! cargo run --release -p opsmith-example-serve -- --addr 127.0.0.1:8080
//! curl -s localhost:8080/v1/predict -H 'content-type: application/json' -d '{"inputs": [[0.3, -0.2]]}'
//! ```
//!
//! `--once` starts the service on a free loopback port, sends it one health check and one
//! prediction, prints both answers and exits (what CI runs).
use opsmith::Device;
use opsmith_example_serve::{Config, Model, Server, StartError};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Args {
    model: String,
    addr: SocketAddr,
    device: Device,
    config: Config,
    once: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        model: "target/mlp.safetensors".into(),
        addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
        device: Device::cuda_if_available(),
        config: Config::default(),
        once: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = value()?,
            "--addr" => args.addr = value()?.parse().map_err(|e| format!("--addr: {e}"))?,
            "--device" => {
                args.device = match value()?.as_str() {
                    "cpu" => Device::Cpu,
                    "cuda" => Device::Cuda(0),
                    other => return Err(format!("--device: expected cpu or cuda, got {other}")),
                }
            }
            "--workers" => args.config.workers = value()?.parse().map_err(|e| format!("--workers: {e}"))?,
            "--max-request-rows" => {
                args.config.max_request_rows = value()?.parse().map_err(|e| format!("--max-request-rows: {e}"))?
            }
            "--max-wait-us" => {
                args.config.max_wait =
                    Duration::from_micros(value()?.parse().map_err(|e| format!("--max-wait-us: {e}"))?)
            }
            "--max-connections" => {
                args.config.max_connections = value()?.parse().map_err(|e| format!("--max-connections: {e}"))?
            }
            "--header-timeout-ms" => args.config.header_timeout = millis(&flag, &value()?)?,
            "--body-timeout-ms" => args.config.body_timeout = millis(&flag, &value()?)?,
            "--request-timeout-ms" => args.config.request_timeout = millis(&flag, &value()?)?,
            "--send-timeout-ms" => args.config.send_timeout = millis(&flag, &value()?)?,
            "--once" => {
                args.once = true;
                args.addr = SocketAddr::from(([127, 0, 0, 1], 0));
            }
            "--help" | "-h" => {
                return Err("usage: serve [--model FILE] [--addr IP:PORT] [--device cpu|cuda] [--workers N] \
                            [--max-request-rows N] [--max-wait-us N] [--max-connections N] \
                            [--header-timeout-ms N] [--body-timeout-ms N] [--request-timeout-ms N] \
                            [--send-timeout-ms N] [--once]"
                    .into());
            }
            other => return Err(format!("unknown argument {other} (try --help)")),
        }
    }
    Ok(args)
}

fn millis(flag: &str, value: &str) -> Result<Duration, String> {
    Ok(Duration::from_millis(value.parse().map_err(|e| format!("{flag}: {e}"))?))
}

/// One HTTP/1.1 request over a fresh connection; returns the status line and the body.
async fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let status = answer.lines().next().unwrap_or_default().to_string();
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    Ok(format!("{status}  {body}"))
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args).await {
        eprintln!("serve: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let model = Arc::new(Model::load(&args.model, args.device).map_err(|e| match e {
        // A missing or unreadable file: say how to make one. A file that is there but invalid
        // names its tensor, and needs no hint.
        StartError::Model(opsmith::autograd::Error::ModelFile { .. }) => {
            format!("{e} (run `cargo run --release --example train_mlp` first to write it)")
        }
        other => other.to_string(),
    })?);
    let features = model.features();
    let server = Server::new(model, args.config.clone())?;
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let addr = listener.local_addr()?;
    println!("serving on http://{addr} on {} with {} workers", args.device, args.config.workers);
    if args.once {
        let server = tokio::spawn(server.serve(listener));
        println!("GET /healthz      -> {}", request(addr, "GET", "/healthz", "").await?);
        let row: Vec<String> = (0..features).map(|i| format!("{:.2}", 0.3 - 0.2 * i as f64)).collect();
        let body = format!("{{\"inputs\": [[{}]]}}", row.join(", "));
        println!("POST /v1/predict  -> {}", request(addr, "POST", "/v1/predict", &body).await?);
        server.abort();
        return Ok(());
    }
    server
        .serve_until(listener, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    Ok(())
}
