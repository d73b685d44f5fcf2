//! Download progress on stderr.
//!
//! Three modes: an `indicatif` bar when stderr is a terminal; a handful of
//! plain lines (start, every 10%, done) otherwise, so CI logs show that a
//! large download is moving without being flooded; nothing when quiet.
//!
//! One `Progress` can span several files (the chunk wheels of one model): the
//! caller fixes the overall total up front when it knows it, and each file
//! reports its own position, which is added to the bytes of the files before
//! it.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Plain-log step when the total size is unknown.
const UNKNOWN_TOTAL_LOG_STEP: u64 = 100 << 20;

enum Sink {
    Quiet,
    Log,
    /// Created when the first file starts: an indicatif bar that is dropped
    /// unused would still draw itself.
    Bar(Option<ProgressBar>),
}

pub(crate) struct Progress {
    label: String,
    sink: Sink,
    /// Fixed total across all files, when known before the first file starts.
    overall: Option<u64>,
    /// The overall total, else the finished files plus the current one's size.
    total: Option<u64>,
    /// Bytes of files already finished.
    base: u64,
    pos: u64,
    /// Set by the first `begin_file`; rates exclude bytes that were resumed.
    started: Option<(Instant, u64)>,
    next_log: u64,
}

impl Progress {
    /// Progress for a single file whose size is learned from the response.
    pub(crate) fn new(label: &str, quiet: bool) -> Self {
        Self::build(label, quiet, None)
    }

    /// Progress for several files, with their combined size if known up front.
    pub(crate) fn for_files(label: &str, quiet: bool, total: Option<u64>) -> Self {
        Self::build(label, quiet, total)
    }

    fn build(label: &str, quiet: bool, overall: Option<u64>) -> Self {
        let sink = if quiet {
            Sink::Quiet
        } else if std::io::stderr().is_terminal() {
            Sink::Bar(None)
        } else {
            Sink::Log
        };
        Progress {
            label: label.to_string(),
            sink,
            overall,
            total: overall,
            base: 0,
            pos: 0,
            started: None,
            next_log: 0,
        }
    }

    /// A file transfer starts (or restarts) at `file_pos` of `file_total`.
    pub(crate) fn begin_file(&mut self, file_total: Option<u64>, file_pos: u64) {
        // Sizes may come from an untrusted index or server: positions
        // saturate rather than overflow, since they only feed the display.
        if self.overall.is_none() {
            self.total = file_total.map(|t| t.saturating_add(self.base));
        }
        self.pos = self.base.saturating_add(file_pos);
        if self.started.is_none() {
            self.started = Some((Instant::now(), self.pos));
            self.announce();
        }
        self.next_log = self.next_log_after(self.pos);
        if let Sink::Bar(Some(bar)) = &self.sink {
            match self.total {
                Some(t) => bar.set_length(t),
                None => bar.unset_length(),
            }
            bar.set_position(self.pos);
        }
    }

    /// `n` more bytes of the current file arrived.
    pub(crate) fn advance(&mut self, n: u64) {
        self.pos = self.pos.saturating_add(n);
        match &self.sink {
            Sink::Quiet | Sink::Bar(None) => {}
            Sink::Bar(Some(bar)) => bar.set_position(self.pos),
            Sink::Log => {
                if self.pos >= self.next_log {
                    let line = match self.total {
                        Some(t) if t > 0 => format!(
                            "{}: {}% ({} of {}, {})",
                            self.label,
                            self.pos.saturating_mul(100) / t,
                            HumanBytes(self.pos),
                            HumanBytes(t),
                            self.rate()
                        ),
                        _ => format!("{}: {} ({})", self.label, HumanBytes(self.pos), self.rate()),
                    };
                    eprintln!("{line}");
                    self.next_log = self.next_log_after(self.pos);
                }
            }
        }
    }

    /// The current file is complete; later files count on top of it.
    pub(crate) fn end_file(&mut self) {
        self.base = self.pos;
    }

    /// A message that must not garble the bar (retries, waits).
    pub(crate) fn note(&self, msg: &str) {
        match &self.sink {
            Sink::Quiet => {}
            Sink::Bar(Some(bar)) => bar.println(format!("{}: {msg}", self.label)),
            Sink::Log | Sink::Bar(None) => eprintln!("{}: {msg}", self.label),
        }
    }

    /// Everything is done.
    pub(crate) fn finish(&mut self) {
        let elapsed = self.elapsed();
        let line = format!(
            "{}: done, {} in {:.1}s",
            self.label,
            HumanBytes(self.pos),
            elapsed.as_secs_f64()
        );
        match &self.sink {
            Sink::Quiet => {}
            Sink::Log | Sink::Bar(None) => eprintln!("{line}"),
            Sink::Bar(Some(bar)) => {
                // Replace the bar with the summary line rather than print both.
                if let Ok(style) = ProgressStyle::with_template("{msg}") {
                    bar.set_style(style);
                }
                bar.finish_with_message(line);
            }
        }
    }

    fn announce(&mut self) {
        let size = match self.total {
            Some(t) => format!(" ({})", HumanBytes(t)),
            None => String::new(),
        };
        let resumed = if self.pos > 0 {
            format!(", resuming at {}", HumanBytes(self.pos))
        } else {
            String::new()
        };
        match &mut self.sink {
            Sink::Quiet => {}
            Sink::Log => eprintln!("{}: downloading{size}{resumed}", self.label),
            Sink::Bar(slot) => {
                let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
                let template = if self.total.is_some() {
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}"
                } else {
                    "{msg} {spinner} {bytes} {bytes_per_sec}"
                };
                if let Ok(style) = ProgressStyle::with_template(template) {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar.set_message(self.label.clone());
                if !resumed.is_empty() {
                    bar.println(format!("{}{resumed}", self.label));
                }
                *slot = Some(bar);
            }
        }
    }

    fn next_log_after(&self, pos: u64) -> u64 {
        match self.total {
            Some(t) if t > 0 => {
                let step = t.div_ceil(10);
                (pos / step).saturating_add(1).saturating_mul(step)
            }
            _ => (pos / UNKNOWN_TOTAL_LOG_STEP + 1).saturating_mul(UNKNOWN_TOTAL_LOG_STEP),
        }
    }

    fn elapsed(&self) -> Duration {
        self.started.map(|(t, _)| t.elapsed()).unwrap_or_default()
    }

    fn rate(&self) -> String {
        let from = self.started.map(|(_, p)| p).unwrap_or(0);
        let secs = self.elapsed().as_secs_f64();
        if secs <= 0.0 {
            return "-".into();
        }
        let per_sec = (self.pos.saturating_sub(from)) as f64 / secs;
        format!("{}/s", HumanBytes(per_sec as u64))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // On an error path leave the bar where it stopped instead of erasing it.
        if let Sink::Bar(Some(bar)) = &self.sink {
            if !bar.is_finished() {
                bar.abandon();
            }
        }
    }
}
