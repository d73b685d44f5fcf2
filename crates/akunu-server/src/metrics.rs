//! Server-wide counters and their Prometheus text exposition (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::registry::LoadedModel;

/// Upper bounds, in seconds, of the latency histograms' buckets.
const BUCKETS: [f64; 12] = [
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if seconds <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// A per-model series: name, type, help, and how to read it.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&LoadedModel) -> f64,
);

pub struct Metrics {
    started: Instant,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// (route, status) -> count.
    requests: BTreeMap<(String, u16), u64>,
    ttft: Histogram,
    duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            inner: Mutex::new(Inner::default()),
        }
    }
}

impl Metrics {
    pub fn request(&self, route: &str, status: u16) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        *m.requests.entry((route.to_string(), status)).or_default() += 1;
    }

    /// A generation request ended (the whole response, streamed or not).
    pub fn generation(&self, took: Duration) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        m.duration.observe(took.as_secs_f64());
    }

    pub fn time_to_first_token(&self, took: Duration) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        m.ttft.observe(took.as_secs_f64());
    }

    pub fn render(&self, models: &[std::sync::Arc<LoadedModel>]) -> String {
        let mut out = String::new();
        let m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            out,
            "# HELP akunu_requests_total HTTP requests by route and status.\n# TYPE akunu_requests_total counter"
        );
        for ((route, status), n) in &m.requests {
            let _ = writeln!(
                out,
                "akunu_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        m.ttft.write(
            &mut out,
            "akunu_time_to_first_token_seconds",
            "From receiving a generation request to its first token.",
        );
        m.duration.write(
            &mut out,
            "akunu_generation_duration_seconds",
            "From receiving a generation request to the end of its response.",
        );
        drop(m);
        let gauges: [Series; 6] = [
            (
                "akunu_prompt_tokens_total",
                "counter",
                "Prompt tokens evaluated.",
                |l| l.engine.stats.prompt_tokens.load(Ordering::Relaxed) as f64,
            ),
            (
                "akunu_completion_tokens_total",
                "counter",
                "Tokens generated.",
                |l| l.engine.stats.completion_tokens.load(Ordering::Relaxed) as f64,
            ),
            (
                "akunu_forward_passes_total",
                "counter",
                "Forward passes run.",
                |l| l.engine.stats.passes.load(Ordering::Relaxed) as f64,
            ),
            (
                "akunu_queue_depth",
                "gauge",
                "Requests waiting for a slot.",
                |l| l.engine.queued() as f64,
            ),
            (
                "akunu_active_sequences",
                "gauge",
                "Sequences holding a slot.",
                |l| l.engine.stats.active.load(Ordering::Relaxed) as f64,
            ),
            (
                "akunu_tokens_per_second",
                "gauge",
                "Tokens generated per second over the last 10 s.",
                |l| l.engine.stats.tokens_per_second(),
            ),
        ];
        for (name, kind, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for model in models {
                let _ = writeln!(
                    out,
                    "{name}{{model=\"{}\"}} {}",
                    escape(&model.id),
                    value(model)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP akunu_uptime_seconds Seconds since the server started.\n# TYPE akunu_uptime_seconds gauge\nakunu_uptime_seconds {}",
            self.started.elapsed().as_secs_f64()
        );
        out
    }
}

/// A label value as the exposition format quotes it.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
