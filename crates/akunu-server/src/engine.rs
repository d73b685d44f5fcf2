//! One engine thread per loaded model.
//!
//! Plan: the thread owns the model's [`Scheduler`] and never touches async code. Handlers
//! send it requests over a channel; it answers each sequence through an unbounded tokio
//! channel, whose closing (the client went away) cancels the sequence before the next pass.
//! While idle the thread blocks on its channel; while busy it drains the channel between
//! passes, so requests join and leave the batch at every step. Counters that the HTTP side
//! reads (queue depth, tokens per second) are atomics beside the channel.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use akunu_core::batch::{Listener, Scheduler, SeqEvent, SeqRequest};
use akunu_core::{Backend, Model, Session};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// How long the tokens-per-second gauge looks back.
const RATE_WINDOW: Duration = Duration::from_secs(10);

enum Command {
    Submit(SeqRequest, ChannelListener),
    Stop(String),
}

/// Counters shared by the engine thread and the HTTP side.
#[derive(Default)]
pub struct EngineStats {
    /// Sequences submitted and not yet finished (waiting or running).
    pub in_flight: AtomicUsize,
    /// Sequences holding a slot.
    pub active: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub passes: AtomicU64,
    /// (time, tokens generated) of recent passes.
    recent: Mutex<VecDeque<(Instant, usize)>>,
}

impl EngineStats {
    /// Generated tokens per second over the last few seconds.
    pub fn tokens_per_second(&self) -> f64 {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let n: usize = recent
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= RATE_WINDOW)
            .map(|(_, n)| n)
            .sum();
        n as f64 / RATE_WINDOW.as_secs_f64()
    }

    fn record_pass(&self, decode: usize, prompt: usize) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            recent.pop_front();
        }
        if decode > 0 {
            recent.push_back((now, decode));
        }
    }
}

/// The HTTP side's end of an engine thread.
pub struct EngineHandle {
    tx: Mutex<mpsc::Sender<Command>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub stats: Arc<EngineStats>,
    pub n_slots: usize,
    pub n_ctx: usize,
    pub describe: String,
}

/// Starts the engine thread of `model` over `session` (whose slots become the batch).
pub fn spawn<B: Backend + Send + 'static>(
    model: Arc<Model>,
    session: Session<B>,
) -> anyhow::Result<EngineHandle> {
    let (n_slots, n_ctx) = (session.n_slots(), session.n_ctx());
    let describe = session.backend().describe();
    let stats = Arc::new(EngineStats::default());
    let (tx, rx) = mpsc::channel();
    // The scheduler is built on the thread (it borrows the model's tokenizer there); its
    // construction error comes back before the handle is returned.
    let (ready_tx, ready_rx) = mpsc::channel();
    let thread_stats = stats.clone();
    let thread = std::thread::Builder::new()
        .name("akunu-engine".into())
        .spawn(move || {
            let scheduler = match Scheduler::new(session, &model.tokenizer) {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            run(scheduler, rx, &thread_stats);
        })?;
    ready_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the engine thread stopped while starting"))??;
    Ok(EngineHandle {
        tx: Mutex::new(tx),
        thread: Mutex::new(Some(thread)),
        stats,
        n_slots,
        n_ctx,
        describe,
    })
}

fn run<B: Backend>(
    mut scheduler: Scheduler<'_, B>,
    rx: mpsc::Receiver<Command>,
    stats: &EngineStats,
) {
    let mut stopping: Option<String> = None;
    loop {
        if scheduler.is_idle() {
            match rx.recv() {
                Ok(cmd) => take(&mut scheduler, cmd, &mut stopping),
                Err(_) => return,
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            take(&mut scheduler, cmd, &mut stopping);
        }
        if let Some(why) = stopping {
            scheduler.abort_all(&why);
            return;
        }
        let step = scheduler.step();
        stats.active.store(scheduler.active(), Ordering::Relaxed);
        if step.decode_tokens + step.prompt_tokens > 0 {
            stats.record_pass(step.decode_tokens, step.prompt_tokens);
        }
    }
}

fn take<B: Backend>(scheduler: &mut Scheduler<'_, B>, cmd: Command, stopping: &mut Option<String>) {
    match cmd {
        Command::Submit(request, listener) => {
            let listener = Box::new(listener);
            let tx = listener.tx.clone();
            // Handlers validate before submitting; a refusal here is a bug, but the client
            // still gets an answer.
            if let Err(e) = scheduler.submit(request, listener) {
                let _ = tx.send(SeqEvent::Failed(e.to_string()));
            }
        }
        Command::Stop(why) => *stopping = Some(why),
    }
}

impl EngineHandle {
    /// Queues a request; its events arrive on the returned receiver, and dropping the
    /// receiver cancels it. Fails when the engine has stopped.
    pub fn submit(&self, request: SeqRequest) -> Option<UnboundedReceiver<SeqEvent>> {
        let (tx, rx) = unbounded_channel();
        self.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let listener = ChannelListener {
            tx,
            guard: InFlight(self.stats.clone()),
        };
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Submit(request, listener));
        sent.ok().map(|_| rx)
    }

    /// Sequences waiting for a slot.
    pub fn queued(&self) -> usize {
        let s = &self.stats;
        s.in_flight
            .load(Ordering::Relaxed)
            .saturating_sub(s.active.load(Ordering::Relaxed))
    }

    /// Ends every sequence with `why` and waits for the thread to exit.
    pub fn stop(&self, why: &str) {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Stop(why.to_string()));
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop("the model was unloaded");
    }
}

struct InFlight(Arc<EngineStats>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

struct ChannelListener {
    tx: UnboundedSender<SeqEvent>,
    guard: InFlight,
}

impl Listener for ChannelListener {
    fn send(&mut self, event: SeqEvent) -> bool {
        if let SeqEvent::Delta { tokens, .. } = &event {
            self.guard
                .0
                .completion_tokens
                .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        }
        self.tx.send(event).is_ok()
    }

    fn cancelled(&self) -> bool {
        self.tx.is_closed()
    }
}
