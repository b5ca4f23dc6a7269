//! The `serve` binary's configuration: each flag can also come from an `OPSMITH_SERVE_*`
//! environment variable (a flag on the command line wins over its variable).
use crate::{Config, ConfigError};
use clap::{Parser, ValueEnum};
use opsmith::Device;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Where `serve` listens when neither `--addr` nor `--once` says otherwise.
pub const DEFAULT_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);

/// Serves the MLP that `train_mlp` writes over HTTP: `POST /v1/predict`, `GET /healthz` and
/// `GET /metrics` (Prometheus).
///
/// Every flag can also be set through the environment variable shown beside it; the flag wins
/// when both are given. SIGTERM or Ctrl-C stops the service gracefully: it stops accepting
/// connections, answers the requests in flight, and exits 0.
#[derive(Clone, Debug, Parser)]
#[command(name = "serve", version)]
pub struct Args {
    /// The model file (safetensors, as `train_mlp` writes it).
    #[arg(long, env = "OPSMITH_SERVE_MODEL", value_name = "FILE", default_value = "target/mlp.safetensors")]
    pub model: PathBuf,

    /// The address to listen on [default: 127.0.0.1:8080; with --once, a free loopback port].
    #[arg(long, env = "OPSMITH_SERVE_ADDR", value_name = "IP:PORT")]
    pub addr: Option<SocketAddr>,

    /// Where the model runs: `auto` is the first CUDA device if there is one, else the CPU.
    #[arg(long, env = "OPSMITH_SERVE_DEVICE", value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,

    /// Worker threads, each with its own CUDA stream (1 to 1,024).
    #[arg(long, env = "OPSMITH_SERVE_WORKERS", value_name = "N", default_value_t = Config::default().workers)]
    pub workers: usize,

    /// The most rows one request may carry (more is a 413).
    #[arg(long, env = "OPSMITH_SERVE_MAX_REQUEST_ROWS", value_name = "N",
          default_value_t = Config::default().max_request_rows)]
    pub max_request_rows: usize,

    /// The most rows a worker merges into one batch (at least --max-request-rows).
    #[arg(long, env = "OPSMITH_SERVE_MAX_MERGED_ROWS", value_name = "N",
          default_value_t = Config::default().max_merged_rows)]
    pub max_merged_rows: usize,

    /// How long a worker waits for more requests to merge after the first, in microseconds.
    #[arg(long, env = "OPSMITH_SERVE_MAX_WAIT_US", value_name = "US",
          default_value_t = micros(Config::default().max_wait))]
    pub max_wait_us: u64,

    /// Requests waiting beyond this many get a 503.
    #[arg(long, env = "OPSMITH_SERVE_QUEUE_CAPACITY", value_name = "N",
          default_value_t = Config::default().queue_capacity)]
    pub queue_capacity: usize,

    /// The largest request body accepted, in bytes (more is a 413).
    #[arg(long, env = "OPSMITH_SERVE_MAX_BODY_BYTES", value_name = "BYTES",
          default_value_t = Config::default().max_body_bytes)]
    pub max_body_bytes: usize,

    /// The most open connections; more wait in the listen backlog.
    #[arg(long, env = "OPSMITH_SERVE_MAX_CONNECTIONS", value_name = "N",
          default_value_t = Config::default().max_connections)]
    pub max_connections: usize,

    /// How long a client has to send a request's headers (also the keep-alive idle timeout), in ms.
    #[arg(long, env = "OPSMITH_SERVE_HEADER_TIMEOUT_MS", value_name = "MS",
          default_value_t = millis(Config::default().header_timeout))]
    pub header_timeout_ms: u64,

    /// How long a client has to send a request's body, in ms (more is a 408).
    #[arg(long, env = "OPSMITH_SERVE_BODY_TIMEOUT_MS", value_name = "MS",
          default_value_t = millis(Config::default().body_timeout))]
    pub body_timeout_ms: u64,

    /// The most a request may take from its headers to its answer, in ms (more is a 503).
    #[arg(long, env = "OPSMITH_SERVE_REQUEST_TIMEOUT_MS", value_name = "MS",
          default_value_t = millis(Config::default().request_timeout))]
    pub request_timeout_ms: u64,

    /// How long a client may take none of its answer before the connection closes, in ms.
    #[arg(long, env = "OPSMITH_SERVE_SEND_TIMEOUT_MS", value_name = "MS",
          default_value_t = millis(Config::default().send_timeout))]
    pub send_timeout_ms: u64,

    /// Log lines as human-readable text or as one JSON object each (to stderr).
    #[arg(long, env = "OPSMITH_SERVE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The least severe events logged; `debug` adds a line per request.
    #[arg(long, env = "OPSMITH_SERVE_LOG_LEVEL", value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,

    /// Serve on a free loopback port, send one health check and one prediction through an HTTP
    /// client, print both answers and exit (non-zero unless both are 200).
    #[arg(long, env = "OPSMITH_SERVE_ONCE")]
    pub once: bool,
}

/// `--device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    /// The first CUDA device if there is one, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device 0.
    Cuda,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// `--log-level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl From<LogLevel> for tracing::level_filters::LevelFilter {
    fn from(level: LogLevel) -> Self {
        match level {
            LogLevel::Error => Self::ERROR,
            LogLevel::Warn => Self::WARN,
            LogLevel::Info => Self::INFO,
            LogLevel::Debug => Self::DEBUG,
            LogLevel::Trace => Self::TRACE,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Args {
    /// The service's [`Config`] (not yet validated: [`crate::Server::new`] does that).
    ///
    /// ```
    /// use clap::Parser;
    /// use opsmith_example_serve::cli::{Args, LogFormat};
    /// let args = Args::try_parse_from(["serve", "--workers", "4", "--log-format", "json"]).unwrap();
    /// assert_eq!(args.config().workers, 4);
    /// assert_eq!(args.log_format, LogFormat::Json);
    /// ```
    pub fn config(&self) -> Config {
        Config {
            workers: self.workers,
            max_request_rows: self.max_request_rows,
            max_merged_rows: self.max_merged_rows,
            max_wait: Duration::from_micros(self.max_wait_us),
            queue_capacity: self.queue_capacity,
            max_body_bytes: self.max_body_bytes,
            max_connections: self.max_connections,
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            send_timeout: Duration::from_millis(self.send_timeout_ms),
        }
    }

    /// The device `--device` names (`auto` looks for a GPU now).
    pub fn device(&self) -> Device {
        match self.device {
            DeviceChoice::Auto => Device::cuda_if_available(),
            DeviceChoice::Cpu => Device::Cpu,
            DeviceChoice::Cuda => Device::Cuda(0),
        }
    }

    /// Where to listen: `--addr`, else a free loopback port under `--once`, else [`DEFAULT_ADDR`].
    pub fn listen_addr(&self) -> SocketAddr {
        match (self.addr, self.once) {
            (Some(addr), _) => addr,
            (None, true) => SocketAddr::new(DEFAULT_ADDR.ip(), 0),
            (None, false) => DEFAULT_ADDR,
        }
    }
}

/// The flag and environment variable that set a [`Config`] field, to point a [`ConfigError`]
/// at what the user typed.
pub fn flag_for(error: &ConfigError) -> Option<(&'static str, &'static str)> {
    Some(match error.field {
        "workers" => ("--workers", "OPSMITH_SERVE_WORKERS"),
        "max_request_rows" => ("--max-request-rows", "OPSMITH_SERVE_MAX_REQUEST_ROWS"),
        "max_merged_rows" => ("--max-merged-rows", "OPSMITH_SERVE_MAX_MERGED_ROWS"),
        "max_wait" => ("--max-wait-us", "OPSMITH_SERVE_MAX_WAIT_US"),
        "queue_capacity" => ("--queue-capacity", "OPSMITH_SERVE_QUEUE_CAPACITY"),
        "max_body_bytes" => ("--max-body-bytes", "OPSMITH_SERVE_MAX_BODY_BYTES"),
        "max_connections" => ("--max-connections", "OPSMITH_SERVE_MAX_CONNECTIONS"),
        "header_timeout" => ("--header-timeout-ms", "OPSMITH_SERVE_HEADER_TIMEOUT_MS"),
        "body_timeout" => ("--body-timeout-ms", "OPSMITH_SERVE_BODY_TIMEOUT_MS"),
        "request_timeout" => ("--request-timeout-ms", "OPSMITH_SERVE_REQUEST_TIMEOUT_MS"),
        "send_timeout" => ("--send-timeout-ms", "OPSMITH_SERVE_SEND_TIMEOUT_MS"),
        _ => return None,
    })
}
