//! A progress bar on standard error for each run (hidden when stderr is not a terminal).

use crate::report::RunLabel;
use indicatif::{ProgressBar, ProgressStyle};
use std::time::{Duration, Instant};

/// How often the bar moves.
pub const TICK: Duration = Duration::from_millis(250);

/// A bar that fills over a run's expected span.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Starts a bar for a run of `span` (warm-up included). Must run inside a tokio runtime.
    pub fn start(span: Duration, label: &RunLabel, clients: usize) -> Progress {
        let total_ms = span.as_millis().max(1) as u64;
        let bar = ProgressBar::new(total_ms);
        let style = ProgressStyle::with_template("{msg} [{bar:30}] {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(format!(
            "{} {} {} clients={}",
            label.system, label.config, label.workload, clients
        ));
        let ticking = bar.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            // Bounded: stops at the span's end, or earlier when aborted by `finish`.
            loop {
                let elapsed = started.elapsed().as_millis() as u64;
                ticking.set_position(elapsed.min(total_ms));
                if elapsed >= total_ms {
                    return;
                }
                tokio::time::sleep(TICK).await;
            }
        });
        Progress { bar, task }
    }

    /// Removes the bar.
    pub fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}
