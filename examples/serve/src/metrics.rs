//! The service's Prometheus metrics, rendered in the text exposition format (version 0.0.4) by
//! hand: a few counters and histograms do not need a metrics crate and its dependencies.
//!
//! * `opsmith_serve_requests_total{route, status}`: answered requests.
//! * `opsmith_serve_request_duration_seconds{route}`: from the request's headers to its answer
//!   (the body's transfer not included).
//! * `opsmith_serve_batch_rows` and `opsmith_serve_batch_requests`: the size of each batch the
//!   model ran, in rows and in requests.
//! * `opsmith_serve_queue_depth`: requests waiting for a worker now.
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The `Content-Type` of `GET /metrics`: the text format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Latency bucket bounds, in seconds.
const LATENCY_BOUNDS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Batch-size bucket bounds (rows or requests): powers of two up to the default merge limit.
const BATCH_BOUNDS: [f64; 13] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0];

/// A histogram with fixed upper bounds. Counts are kept per bucket and summed when rendered,
/// so `_count` always equals the `+Inf` bucket.
#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, then the overflow (above the last bound).
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    fn observe(&mut self, value: f64) {
        // `le` is inclusive: a value equal to a bound falls in that bound's bucket.
        let bucket = self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len());
        self.counts[bucket] += 1;
        self.sum += value;
    }

    /// `_bucket`, `_sum` and `_count` lines for one series; `labels` is empty or `key="value",`.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{}\"}} {cumulative}", float(*bound));
        }
        cumulative += self.counts[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}");
        let braces = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.trim_end_matches(',')) };
        let _ = writeln!(out, "{name}_sum{braces} {}", float(self.sum));
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}

/// A number as Prometheus reads it: Rust's shortest round-trip form (`0.005`, `1`, `1e-7`),
/// with Prometheus's spellings of the non-finite values.
fn float(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{value}")
    }
}

/// A label value with `\`, `"` and newlines escaped, as the format requires.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[derive(Debug)]
struct Recorded {
    /// Answers by (route, status code).
    requests: BTreeMap<(&'static str, u16), u64>,
    /// Latency by route.
    latency: BTreeMap<&'static str, Histogram>,
    batch_rows: Histogram,
    batch_requests: Histogram,
}

/// What the service has done so far. One lock for everything recorded: it is held for a few
/// additions, and a scrape sees a consistent snapshot (its counts agree with its histograms).
#[derive(Debug)]
pub(crate) struct Metrics {
    recorded: Mutex<Recorded>,
    /// Requests accepted into the queue and not yet taken by a worker. Signed: a worker may
    /// take a request before the handler's increment is seen.
    queue_depth: AtomicI64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            recorded: Mutex::new(Recorded {
                requests: BTreeMap::new(),
                latency: BTreeMap::new(),
                batch_rows: Histogram::new(&BATCH_BOUNDS),
                batch_requests: Histogram::new(&BATCH_BOUNDS),
            }),
            queue_depth: AtomicI64::new(0),
        }
    }
}

impl Metrics {
    /// The lock; nothing recorded can be left half-updated by a panic, so a poisoned one is fine.
    fn recorded(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One answered request on `route` (one of a fixed set, so the label cannot grow unbounded).
    pub(crate) fn request(&self, route: &'static str, status: u16, took: Duration) {
        let mut recorded = self.recorded();
        *recorded.requests.entry((route, status)).or_default() += 1;
        recorded.latency.entry(route).or_insert_with(|| Histogram::new(&LATENCY_BOUNDS)).observe(took.as_secs_f64());
    }

    /// One batch run by the model.
    pub(crate) fn batch(&self, rows: usize, requests: usize) {
        let mut recorded = self.recorded();
        recorded.batch_rows.observe(rows as f64);
        recorded.batch_requests.observe(requests as f64);
    }

    /// A request entered (`+1`) or left (`-1`) the queue.
    pub(crate) fn queue_changed(&self, by: i64) {
        self.queue_depth.fetch_add(by, Ordering::SeqCst);
    }

    /// Requests waiting for a worker now.
    pub(crate) fn queue_depth(&self) -> i64 {
        self.queue_depth.load(Ordering::SeqCst).max(0)
    }

    /// Everything, in the Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let recorded = self.recorded();
        let mut out = String::new();
        out.push_str("# HELP opsmith_serve_requests_total Requests answered, by route and status code.\n");
        out.push_str("# TYPE opsmith_serve_requests_total counter\n");
        for ((route, status), count) in &recorded.requests {
            let _ = writeln!(
                out,
                "opsmith_serve_requests_total{{route=\"{}\",status=\"{status}\"}} {count}",
                escape(route)
            );
        }
        out.push_str(
            "# HELP opsmith_serve_request_duration_seconds Time from a request's headers to its answer, by route.\n",
        );
        out.push_str("# TYPE opsmith_serve_request_duration_seconds histogram\n");
        for (route, histogram) in &recorded.latency {
            histogram.render(
                &mut out,
                "opsmith_serve_request_duration_seconds",
                &format!("route=\"{}\",", escape(route)),
            );
        }
        out.push_str("# HELP opsmith_serve_batch_rows Rows in each batch the model ran.\n");
        out.push_str("# TYPE opsmith_serve_batch_rows histogram\n");
        recorded.batch_rows.render(&mut out, "opsmith_serve_batch_rows", "");
        out.push_str("# HELP opsmith_serve_batch_requests Requests merged into each batch the model ran.\n");
        out.push_str("# TYPE opsmith_serve_batch_requests histogram\n");
        recorded.batch_requests.render(&mut out, "opsmith_serve_batch_requests", "");
        out.push_str("# HELP opsmith_serve_queue_depth Requests waiting for a worker.\n");
        out.push_str("# TYPE opsmith_serve_queue_depth gauge\n");
        let _ = writeln!(out, "opsmith_serve_queue_depth {}", self.queue_depth());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact text for known observations: cumulative buckets, inclusive bounds, `+Inf`,
    /// `_sum` and `_count`, labels in order, HELP and TYPE before each family.
    #[test]
    fn renders_the_text_format_exactly() {
        let metrics = Metrics::default();
        metrics.request("/v1/predict", 200, Duration::from_millis(1));
        metrics.request("/v1/predict", 200, Duration::from_millis(40));
        metrics.request("/v1/predict", 422, Duration::from_secs(60));
        metrics.request("/healthz", 200, Duration::from_micros(250));
        metrics.batch(1, 1);
        metrics.batch(3, 2);
        metrics.batch(5000, 2);
        metrics.queue_changed(2);
        metrics.queue_changed(-1);
        let text = metrics.render();
        let expected_start = "\
# HELP opsmith_serve_requests_total Requests answered, by route and status code.
# TYPE opsmith_serve_requests_total counter
opsmith_serve_requests_total{route=\"/healthz\",status=\"200\"} 1
opsmith_serve_requests_total{route=\"/v1/predict\",status=\"200\"} 2
opsmith_serve_requests_total{route=\"/v1/predict\",status=\"422\"} 1
# HELP opsmith_serve_request_duration_seconds Time from a request's headers to its answer, by route.
# TYPE opsmith_serve_request_duration_seconds histogram
opsmith_serve_request_duration_seconds_bucket{route=\"/healthz\",le=\"0.001\"} 1
";
        assert!(text.starts_with(expected_start), "{text}");
        let predict: Vec<&str> =
            text.lines().filter(|l| l.contains("duration_seconds") && l.contains("predict")).collect();
        assert_eq!(
            predict,
            [
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.001\"} 1",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.0025\"} 1",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.005\"} 1",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.01\"} 1",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.025\"} 1",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.05\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.1\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.25\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"0.5\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"1\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"2.5\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"5\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"10\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"30\"} 2",
                "opsmith_serve_request_duration_seconds_bucket{route=\"/v1/predict\",le=\"+Inf\"} 3",
                "opsmith_serve_request_duration_seconds_sum{route=\"/v1/predict\"} 60.041",
                "opsmith_serve_request_duration_seconds_count{route=\"/v1/predict\"} 3",
            ]
        );
        let expected_end = "\
# HELP opsmith_serve_batch_rows Rows in each batch the model ran.
# TYPE opsmith_serve_batch_rows histogram
opsmith_serve_batch_rows_bucket{le=\"1\"} 1
opsmith_serve_batch_rows_bucket{le=\"2\"} 1
opsmith_serve_batch_rows_bucket{le=\"4\"} 2
opsmith_serve_batch_rows_bucket{le=\"8\"} 2
opsmith_serve_batch_rows_bucket{le=\"16\"} 2
opsmith_serve_batch_rows_bucket{le=\"32\"} 2
opsmith_serve_batch_rows_bucket{le=\"64\"} 2
opsmith_serve_batch_rows_bucket{le=\"128\"} 2
opsmith_serve_batch_rows_bucket{le=\"256\"} 2
opsmith_serve_batch_rows_bucket{le=\"512\"} 2
opsmith_serve_batch_rows_bucket{le=\"1024\"} 2
opsmith_serve_batch_rows_bucket{le=\"2048\"} 2
opsmith_serve_batch_rows_bucket{le=\"4096\"} 2
opsmith_serve_batch_rows_bucket{le=\"+Inf\"} 3
opsmith_serve_batch_rows_sum 5004
opsmith_serve_batch_rows_count 3
# HELP opsmith_serve_batch_requests Requests merged into each batch the model ran.
# TYPE opsmith_serve_batch_requests histogram
opsmith_serve_batch_requests_bucket{le=\"1\"} 1
opsmith_serve_batch_requests_bucket{le=\"2\"} 3
";
        assert!(text.contains(expected_end), "{text}");
        assert!(text.ends_with(
            "opsmith_serve_batch_requests_sum 5\nopsmith_serve_batch_requests_count 3\n\
             # HELP opsmith_serve_queue_depth Requests waiting for a worker.\n\
             # TYPE opsmith_serve_queue_depth gauge\nopsmith_serve_queue_depth 1\n"
        ));
    }

    #[test]
    fn label_values_and_numbers_are_escaped_and_spelled_as_prometheus_reads_them() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(
            (float(0.005), float(30.0), float(f64::INFINITY), float(f64::NAN)),
            ("0.005".into(), "30".into(), "+Inf".into(), "NaN".into())
        );
    }
}
